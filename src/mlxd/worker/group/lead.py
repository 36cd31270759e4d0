"""Rank 0's part of the worker's start (app.serve): join the group, then its engine."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from mlxd.shared.exit_codes import EXIT_CRASH, EXIT_MODEL_LOAD_ERROR
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.dist.shard import join_group
from mlxd.worker.engine.loop import Engine
from mlxd.worker.group.channel import Channel, open_links
from mlxd.worker.group.engine import LeadEngine

log = logging.getLogger("mlxd.worker.group")

# A group's ranks never demote prompt-cache entries by idle time (each rank's clock would
# decide alone); they leave RAM by the byte cap, the same on every rank.
GROUP_IDLE_S = 1e12
# Speculative decoding is off in a group: a draft model would run on rank 0 alone, and the
# verify forwards would have to happen in step on every rank (docs/scale-out.md).
GROUP_OFF = {"speculative": "off"}


def join_as_lead(cfg: WorkerSpec, embedding: bool) -> tuple[Channel | None, int]:
    """(the group's channel, 0), or (None, the exit code) when this worker cannot lead it."""
    assert cfg.group is not None
    if embedding:
        log.error(
            "cannot load model=%s: embedding models are not served by worker groups",
            cfg.model_id,
        )
        return None, EXIT_MODEL_LOAD_ERROR
    try:
        group = join_group(cfg.group)
        links = open_links(cfg.group.link, 0, cfg.group.size)
        return Channel(group, links), 0
    except Exception as exc:
        log.error("cannot join the worker group of model=%s: %s", cfg.model_id, exc)
        return None, EXIT_CRASH


def lead_engine(channel: Channel | None) -> Callable[..., Engine]:
    """The engine class for rank 0 of `channel`'s group (None: a worker of its own)."""
    if channel is None:
        return Engine
    return functools.partial(LeadEngine, channel=channel)
