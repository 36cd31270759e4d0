"""One definition of a model's memory (shared/wire/memory.py): every view shows the same figures,
taken from the worker's own report (docs/operations.md, "Memory")."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer
from fake_workers import Fleet, make_registry

from mlxd.shared.sizes import format_size
from mlxd.shared.wire.memory import ModelMemory
from mlxd.supervisor.ctl.tables import ps_table, show_text
from mlxd.supervisor.daemon import build_app

MiB = 1 << 20
REPORT = ModelMemory(
    weights_bytes=300 * MiB,
    prompt_cache_bytes=20 * MiB,
    kv_reserved_bytes=8 * MiB,
    kv_in_use_bytes=2 * MiB,
)


def test_the_total_is_weights_prompt_cache_and_reserved_kv():
    assert REPORT.total_bytes == 328 * MiB
    assert REPORT.model_dump()["total_bytes"] == 328 * MiB  # on the wire too
    est = ModelMemory.estimate(1000, 200)
    assert (est.weights_bytes, est.kv_reserved_bytes, est.total_bytes) == (800, 200, 1000)
    assert not est.reported
    two = REPORT.times(2)  # a worker group's two local ranks; the prompt cache is rank 0's
    assert two.total_bytes == 2 * 308 * MiB + 20 * MiB and two.kv_in_use_bytes == 4 * MiB
    assert REPORT.times(1) is REPORT


def test_every_view_shows_the_workers_report(tmp_path):
    async def main():
        fleet = Fleet(load_s=0)
        fleet.reports["a"] = REPORT
        reg = make_registry(tmp_path, fleet, "a", "b")
        app = build_app(reg.settings, reg)
        try:
            async with TestClient(TestServer(app, host="127.0.0.1")) as client:
                before = await (await client.get("/admin/models/a")).json()
                assert (await client.post("/admin/models/a/load", json={})).status == 200
                views = {}
                for path in ("/admin/models", "/admin/models/a", "/admin/memory", "/api/ps"):
                    views[path] = await (await client.get(path)).json()
                return before, views
        finally:
            await reg.shutdown()

    before, views = asyncio.run(main())
    assert before["memory"] is None  # not running: nothing held
    want = REPORT.model_dump()
    listed = {m["id"]: m for m in views["/admin/models"]["data"]}
    assert listed["a"]["memory"] == want and listed["b"]["memory"] is None
    detail = views["/admin/models/a"]
    assert detail["memory"] == want and detail["footprint_bytes"] == REPORT.total_bytes
    mem = views["/admin/memory"]
    assert [m["memory"] for m in mem["models"]] == [want]
    assert mem["used_bytes"] == REPORT.total_bytes
    (ps,) = views["/api/ps"]["models"]
    assert ps["size"] == ps["size_vram"] == REPORT.total_bytes
    # mlxctl ps and show print the same total, with units
    row = ps_table(views["/admin/models"]["data"]).splitlines()[1]
    assert row.split()[:2] == ["a", "ready"] and "328 MiB" in row
    shown = show_text(detail)
    assert (
        "memory     328 MiB: weights 300 MiB, prompt cache 20 MiB, KV 2 MiB in use of 8 MiB"
        " reserved" in shown
    )
    assert format_size(REPORT.total_bytes) == "328 MiB"
