"""A worker that cannot even be spawned leaves its model FATAL with the reason, not STARTING."""

from __future__ import annotations

import asyncio
import json

import pytest

from mlxd.shared.config import load_settings
from mlxd.shared.errors import Unavailable
from mlxd.supervisor.registry import Registry
from mlxd.supervisor.states import State
from mlxd.supervisor.upstream import UpstreamPool


class Unspawnable:
    def __init__(self, model_id, argv, log_path):
        self.returncode = None

    async def spawn(self):
        raise OSError(24, "Too many open files")


def test_spawn_failure_is_fatal_with_its_reason(tmp_path):
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    settings = load_settings({"home": str(tmp_path), "discover_hf_cache": False})

    async def go():
        reg = Registry(settings, UpstreamPool(), total_memory_bytes=1 << 34,
                       spawner=Unspawnable)
        with pytest.raises(Unavailable, match="Too many open files"):
            await reg.acquire(reg.resolve("m"))
        slot = reg.slots["m"]
        assert slot.state is State.FATAL and "Too many open files" in slot.last_error
        with pytest.raises(Unavailable, match="FATAL"):
            await reg.acquire(reg.resolve("m"))
        await reg.upstream.close_all()

    asyncio.run(go())
