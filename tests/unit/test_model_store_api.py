"""Ollama's model management routes in process, over fake workers and a fake pull (no process,
no network): who may call them, one pull per model followed by every client asking for it and
cancelled when the last one leaves, delete of a loaded model (unloaded first), copy and create
with a folder's own settings (docs/api.md, "Managing models")."""

from __future__ import annotations

import asyncio
import json
import threading

from fake_workers import until, with_app

from mlxd.shared.errors import BadRequest
from mlxd.supervisor.http.ollama_manage import store_of
from mlxd.supervisor.store import folders, progress
from mlxd.supervisor.store.hub import Cancelled

TOKEN = "admin-secret"


def test_managing_models_takes_the_admin_token_and_no_other_origin(tmp_path):
    async def go(client, reg, app):
        body = {"model": "not a name!"}
        with_key = {"Authorization": "Bearer api-key"}
        with_token = {"Authorization": f"Bearer {TOKEN}"}
        out = {
            "api key": await client.post("/api/pull", json=body, headers=with_key),
            "admin token": await client.post("/api/pull", json=body, headers=with_token),
            "tags, api key": await client.get("/api/tags", headers=with_key),
            "other origin": await client.post(
                "/api/pull", json=body, headers={**with_token, "Origin": "http://evil.example"}
            ),
            "delete": await client.delete("/api/delete", json={"model": "a"}, headers=with_key),
            "push": await client.post("/api/push", json={"model": "a"}, headers=with_token),
        }
        return {k: (r.status, await r.json()) for k, r in out.items()}

    got = with_app(tmp_path, go, admin_token=TOKEN, api_key="api-key")
    assert got["api key"][0] == 401 and "admin token" in got["api key"][1]["error"]
    assert (
        got["admin token"][0] == 400 and "not a name mlxd knows" in got["admin token"][1]["error"]
    )
    assert got["tags, api key"][0] == 200  # the rest of /api keeps the API key's rule
    assert got["other origin"] == (
        403,
        {"error": "Cross-origin requests to this route are not allowed"},
    )
    assert got["delete"][0] == 401
    assert got["push"][0] == 501 and "does not publish" in got["push"][1]["error"]


def _fake_pull(release: threading.Event, calls: list):
    """A pull that shows progress, then waits for `release` (or its cancellation)."""

    def run(target, models_dir, hub, *, emit, cancelled, on_ready):
        calls.append(target.model_id)
        if target.model_id == "org/fails":
            raise BadRequest("'org/fails' has no config.json")
        emit(progress.line(progress.MANIFEST))
        on_ready()
        emit(progress.line("pulling model.safetensors"))
        while not release.wait(0.01):
            if cancelled():
                raise Cancelled("cancelled")
        folder = models_dir / "org" / "m"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        emit(progress.line(progress.SUCCESS))
        return folder

    return run


async def _lines(resp, count: int) -> list[dict]:
    out = []
    while len(out) < count:
        out.append(json.loads(await asyncio.wait_for(resp.content.readline(), 5)))
    return out


def test_one_pull_per_model_followed_by_every_client_and_cancelled_by_the_last(tmp_path):
    release, calls = threading.Event(), []

    async def go(client, reg, app):
        store = store_of(app)
        store.pulls.run = _fake_pull(release, calls)
        first = await client.post("/api/pull", json={"model": "org/m"})
        seen_first = await _lines(first, 2)
        second = await client.post("/api/pull", json={"model": "org/m"})
        seen_second = await _lines(second, 2)  # the progress so far, from the same pull
        busy = await client.delete("/api/delete", json={"model": "org/m"})
        failed = await client.post("/api/pull", json={"model": "org/fails", "stream": False})
        first.close()
        await asyncio.sleep(0.05)
        assert not store.pulls.active["org/m"].cancel.is_set()  # one client still follows it
        second.close()
        await until(lambda: "org/m" not in store.pulls.active)  # the last one left: cancelled
        again = asyncio.create_task(
            client.post("/api/pull", json={"model": "org/m", "stream": False})
        )
        await until(lambda: len(calls) == 3)
        release.set()
        again = await again
        metrics = await (await client.get("/metrics")).text()
        return seen_first, seen_second, busy, failed, again, metrics

    try:
        seen_first, seen_second, busy, failed, again, metrics = with_app(tmp_path, go)
    finally:
        release.set()
    pulls = [line for line in metrics.splitlines() if line.startswith("mlxd_requests_total{")]
    pulls = [line for line in pulls if 'route="/api/pull"' in line]
    # A name that never became a model stays out of the labels (any name may be asked).
    assert any('model=""' in line and 'status="400"' in line for line in pulls)
    assert not any("org/fails" in line for line in pulls)
    assert any('model="org/m"' in line and 'status="200"' in line for line in pulls)
    assert [x["status"] for x in seen_first] == ["pulling manifest", "pulling model.safetensors"]
    assert seen_second == seen_first and calls[:2] == ["org/m", "org/fails"]
    assert busy.status == 409
    assert failed.status == 400  # a failure before the download: the request's own status
    assert calls[2:] == ["org/m"] and again.status == 200


def test_delete_unloads_a_loaded_model_first_and_keeps_what_it_does_not_own(tmp_path):
    async def go(client, reg, app):
        slot = await reg.leases.acquire(reg.catalog.resolve("a"))
        reg.leases.release(slot)
        worker = slot.process
        deleted = await client.delete("/api/delete", json={"model": "a:latest"})
        tags = await (await client.get("/api/tags")).json()
        missing = await client.delete("/api/delete", json={"model": "a"})
        return deleted.status, worker.returncode, tags, missing.status, "a" in reg.lifecycle.slots

    deleted, code, tags, missing, routed = with_app(tmp_path, go)
    assert deleted == 200 and code is not None and not routed  # stopped, then forgotten
    assert [m["name"] for m in tags["models"]] == ["b:latest"]
    assert not (tmp_path / "models" / "a").exists() and missing == 404


def test_copy_and_create_give_the_new_model_its_own_settings(tmp_path):
    async def go(client, reg, app):
        copied = await client.post("/api/copy", json={"source": "a", "destination": "c"})
        made = await client.post(
            "/api/create",
            json={
                "model": "terse:v1",
                "modelfile": 'FROM c\nPARAMETER temperature 0.1\nSYSTEM "Be terse."',
                "parameters": {"num_ctx": 512},
                "stream": False,
            },
        )
        shown = await (await client.post("/api/show", json={"model": "terse:v1"})).json()
        detail = await (await client.get("/admin/models/terse:v1")).json()
        refusals = [
            await client.post(
                "/api/create", json={"model": "x", "from": "a", "adapters": {"a": "b"}}
            ),
            await client.post("/api/create", json={"model": "x", "from": "relative/file.gguf"}),
            await client.post("/api/create", json={"model": "x", "from": "/no/such/folder"}),
            await client.post("/api/create", json={"model": "x"}),
            await client.post("/api/copy", json={"source": "a", "destination": "a:latest"}),
            await client.post("/api/copy", json={"source": "nope", "destination": "z"}),
        ]
        errors = [(r.status, (await r.json())["error"]) for r in refusals]
        return copied.status, await made.json(), shown, detail, errors

    copied, made, shown, detail, errors = with_app(tmp_path, go)
    assert copied == 200 and (tmp_path / "models" / "c" / "config.json").is_file()
    assert made == {"status": "success"}
    assert (
        "PARAMETER temperature" in shown["modelfile"] and 'SYSTEM "Be terse."' in shown["modelfile"]
    )
    assert detail["sampling_defaults"]["temperature"] == 0.1
    assert detail["sampling_defaults"]["system"] == "Be terse."
    assert detail["settings"]["context_limit"] == 512
    assert [s for s, _ in errors] == [400, 400, 400, 400, 400, 404]
    assert "adapters" in errors[0][1] and "relative path" in errors[1][1]
    assert "neither a GGUF file nor a model folder" in errors[2][1] and "'from'" in errors[3][1]


def test_copy_create_and_pull_never_replace_a_folder_of_other_models(tmp_path):
    async def go(client, reg, app):
        made = await client.post("/api/copy", json={"source": "a", "destination": "org/m"})
        tries = [
            await client.post("/api/copy", json={"source": "b", "destination": "org"}),
            await client.post("/api/create", json={"model": "org", "from": "a"}),
            await client.post("/api/copy", json={"source": "b", "destination": "a/inner"}),
            await client.post("/api/copy", json={"source": "b", "destination": "A"}),
        ]
        names = [m["name"] for m in (await (await client.get("/api/tags")).json())["models"]]
        return made.status, [(r.status, (await r.json())["error"]) for r in tries], names

    made, refusals, names = with_app(tmp_path, go)
    assert made == 200 and [s for s, _ in refusals] == [400, 400, 400, 400]
    assert "folder of other models" in refusals[0][1] and "folder of other models" in refusals[1][1]
    assert "'a' is a model" in refusals[2][1] and "differs only in case" in refusals[3][1]
    assert sorted(names) == ["a:latest", "b:latest", "org/m:latest"]
    assert (tmp_path / "models" / "a" / "config.json").is_file()


def test_deleting_an_alias_is_refused_and_keeps_its_model(tmp_path):
    async def go(client, reg, app):
        gone = await client.delete("/api/delete", json={"model": "short:latest"})
        return gone.status, (await gone.json())["error"]

    status, error = with_app(tmp_path, go, models={"a": {"aliases": ["short"]}})
    assert status == 400 and "'short' is an alias of 'a'" in error
    assert (tmp_path / "models" / "a" / "config.json").is_file()


def test_a_partial_download_is_not_deleted_while_mlxctl_pulls_it(tmp_path):
    staging = tmp_path / "models" / ".downloads" / "org--m"

    async def go(client, reg, app):
        staging.mkdir(parents=True)
        (staging / "model.safetensors.part").write_bytes(b"half")
        with folders.exclusive(tmp_path / "models", "org--m", "a download of 'org/m'"):
            busy = await client.delete("/api/delete", json={"model": "org/m"})
            kept = (staging / "model.safetensors.part").exists()
        done = await client.delete("/api/delete", json={"model": "org/m"})
        return busy.status, (await busy.json())["error"], kept, done.status

    busy, error, kept, done = with_app(tmp_path, go)
    assert busy == 409 and "already under way" in error and kept
    assert done == 200 and not staging.exists()
