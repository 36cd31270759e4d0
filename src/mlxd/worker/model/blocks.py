"""Prefill shapes in blocks (CUDA): every prefill attention call of a few shapes, not one per
prompt history.

On CUDA, MLX hands prefill attention to cuDNN, which builds a graph for each combination of
rows, query length and key length it meets (80 ms on the 8B shape, up to 1.5 s on the 0.6B)
and caches it. Rows that extend a cached prefix (agent sessions) attend over keys whose length
is their own history's, which never repeats: each such row paid a build at every turn (0.59 s
of a 1.01 s first token at 8 sessions; docs/benchmarks.md). With a block of B tokens:

- a prompt-cache hit is cut down to a multiple of B (`aligned_hit`: at most B-1 tokens
  prefilled again),
- each prefill forward's width is rounded up to a multiple of B (right padding: the padded
  positions come after every real one, so no real token attends them; mlx-lm rolls them
  into left padding afterwards, as it does for its own right padding),
- the planner's chunk is a multiple of B (planner.py),

so a row's queries and keys are whole blocks, and `attention.routed` sends such calls to the
fused causal kernel in a few batch sizes: the graphs are built once per (rows, blocks of
queries, blocks of keys) and then reused. Greedy output is unchanged (the padding is never
attended; a re-prefilled token's KV is the same computation).

`block` is process-wide (one model per worker), set at load (load.py) from the
`prefill_block` setting. Off (0) by default: it did not pay on an H100 (2026-12-06: 4 and 8
rows extending a cached 6k prefix took 2.2x and 1.4x as long with 256-token blocks, the
padding's KV roll in mlx-lm's finalize costing more than the graph builds saved; on the CPU,
where nothing is built, 250-token extensions took 2.2x as long); always off on Metal and the
CPU (no graph builds there) and for models whose caches are not all plain KV (rotating
windows, recurrent state and quantized KV have their own rules for reuse).
"""

from __future__ import annotations

block = 0  # tokens; 0: off
ANY_DEVICE = False  # benchmarks measuring the cost on the CPU turn the device check off


def set_block(tokens: int) -> None:
    global block
    if tokens < 0:
        raise ValueError("the prefill block must be 0 (off) or a positive token count")
    block = tokens


def round_up(n: int, size: int | None = None) -> int:
    """`n` rounded up to whole blocks of `size` (None: the process's block); itself when off.
    Pure: the planner rounds its chunk with it (no MLX imported by this module)."""
    size = block if size is None else size
    return n if size <= 0 else -(-n // size) * size


def is_whole(n: int) -> bool:
    """Whether `n` tokens are whole blocks (never, when off)."""
    return block > 0 and n > 0 and n % block == 0


def aligned_hit(layers: list | None, n: int) -> tuple[list | None, int]:
    """A prompt-cache hit of `n` tokens cut down to whole blocks: the same caches at the
    shorter offset (`layers` are the cache's views, fresh objects over shared arrays, so
    only their offset changes; PromptCache.fetch cuts every hit it hands out). Anything but
    plain KV caches is left as it is."""
    from mlxd.worker.kv.layers import plain_only

    if block <= 0 or layers is None or n % block == 0 or not plain_only(layers):
        return layers, n
    cut = n - n % block
    if cut == 0:
        return None, 0
    for c in layers:
        c.offset = cut
    return layers, cut
