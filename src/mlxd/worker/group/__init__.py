"""A worker group: one model's ranks joined by mx.distributed, stepping in lockstep.

env.py (where the backend finds its peers), wire.py (the events rank 0 shares each engine
iteration, as bytes; no MLX), channel.py (those bytes to every rank, over links),
shard.py (joining the group, loading one shard of the model), engine.py (rank 0's and the
followers' engines), lead.py (rank 0's start), follower.py (a follower process: no HTTP).
The design is in docs/scale-out.md.
"""
