"""A follower rank's process: its shard of the model and an engine fed by rank 0, no HTTP.

It lives as long as its engine: rank 0's stop reaches it as an event, and it exits 0 once
its engine has stopped. If its engine dies it exits 1, and the supervisor restarts the whole
group (lifecycle/group.py).
"""

from __future__ import annotations

import functools
import logging

from mlxd.shared.exit_codes import EXIT_CRASH, EXIT_MODEL_LOAD_ERROR, EXIT_OK
from mlxd.shared.lifeline import exit_when_orphaned
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.dist.shard import join_group
from mlxd.worker.engine.assemble import make_engine, make_prompt_cache  # as rank 0 makes them
from mlxd.worker.group.channel import Channel, open_links
from mlxd.worker.group.engine import FollowerEngine
from mlxd.worker.group.lead import GROUP_IDLE_S, GROUP_OFF
from mlxd.worker.model.load import limit_buffer_cache, load_for_spec

log = logging.getLogger("mlxd.worker.group")

FLUSH_S = 25.0  # within the supervisor's grace for followers (lifecycle/group.py)


def run_follower(cfg: WorkerSpec) -> int:
    """Join the group, load this rank's shard, step with rank 0 until it stops; the exit code."""
    assert cfg.group is not None
    if cfg.exit_with_parent:
        exit_when_orphaned(EXIT_CRASH)
    try:
        group = join_group(cfg.group)
        g = cfg.group
        links = open_links(g.link, g.rank, g.size)
    except Exception as exc:
        log.error("cannot join the worker group of model=%s: %s", cfg.model_id, exc)
        return EXIT_CRASH
    try:
        loaded = load_for_spec(cfg, group)
    except Exception as exc:
        log.error("cannot load model=%s path=%s: %s", cfg.model_id, cfg.model_path, exc)
        return EXIT_MODEL_LOAD_ERROR
    cfg = cfg.model_copy(update={"cache_idle_s": GROUP_IDLE_S, **GROUP_OFF})  # as rank 0's
    cache = make_prompt_cache(cfg, loaded)
    limit_buffer_cache()
    follower = functools.partial(FollowerEngine, channel=Channel(group, links))
    engine = make_engine(cfg, loaded, cache, engine_cls=follower)
    engine.start()
    log.info("following rank 0: model=%s rank=%d", cfg.model_id, g.rank)
    while not engine.join(1.0):
        pass
    if cache is not None:  # a drain's writes land before the process goes
        cache.writes.flush(FLUSH_S)
    if engine.dead is not None:
        log.error("engine stopped: %s", engine.dead)
        return EXIT_CRASH
    return EXIT_OK
