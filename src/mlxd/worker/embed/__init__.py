"""mlxd.worker.embed: embedding models (headless loading, forward planning, pooling)."""
