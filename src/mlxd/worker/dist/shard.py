"""Joining the group and holding one shard of the model.

The backend reads where its peers are from the environment the entry point set from the
spec (MLX_RANK, MLX_HOSTFILE for ring; NCCL_* for nccl). The model is sharded with mlx-lm's
own tensor parallelism (`model.shard(group)`: attention heads and MLP columns split across
ranks, one all_sum per projection back to full width); it is loaded lazily, so each rank
materialises only its shard. Architectures without `shard` are refused.
"""

from __future__ import annotations

import logging

import mlx.core as mx

from mlxd.shared.worker_spec import GroupSpec
from mlxd.worker.dist.env import forget_hostfile

log = logging.getLogger("mlxd.worker.group")


class UnsupportedModel(ValueError):
    """The model cannot be split over a worker group."""


def join_group(spec: GroupSpec):
    """This process's mx.distributed group, checked against the spec."""
    try:
        group = mx.distributed.init(strict=True, backend=spec.backend)
    finally:
        forget_hostfile()  # read at init
    if group.size() != spec.size or group.rank() != spec.rank:
        raise RuntimeError(
            f"the {spec.backend} backend joined rank {group.rank()} of {group.size()}, "
            f"expected rank {spec.rank} of {spec.size}"
        )
    log.info("joined worker group: rank %d of %d (%s)", spec.rank, spec.size, spec.backend)
    return group


def check_shardable(model, config: dict, size: int) -> None:
    """Raise UnsupportedModel unless `model` splits evenly `size` ways."""
    kind = config.get("model_type", type(model).__name__)
    if not hasattr(model, "shard"):
        raise UnsupportedModel(
            f"model type '{kind}' has no tensor-parallel sharding in mlx-lm; "
            f"it cannot be served by a worker group (group_size or hosts)"
        )
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = config.get(key)
        if isinstance(value, int) and value % size:
            raise UnsupportedModel(
                f"model type '{kind}': {key}={value} does not split into {size} equal shards"
            )


def shard_model(model, config: dict, group) -> None:
    """Keep this rank's shard of `model` (loaded lazily) and materialise it; then wait for
    every rank to have done so (a slow loader must not time a peer out)."""
    check_shardable(model, config, group.size())
    model.shard(group)
    mx.eval(model.parameters())
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
