"""Faults in the SSD tier of the prompt cache, through a real worker process: junk that cannot
be removed, an unusable cache folder, entries of the wrong shapes, failed writes, two ids of one
model. Each costs cache hits at most: the worker starts, serves and reports what it persisted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import orjson
import pytest
import safetensors.numpy as stnp

from mlxd.worker.cache.layout import fingerprint, safe_name
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.cache.ssd import SsdStore
from mlxd.worker.cache.trie import common_prefix

from procs import ROOT, start_worker, stop, uds_client, uds_openai

LONG = " ".join(f"Note {i}: the lantern on pier {i * 3} is green." for i in range(20))


def ask(oai, content: str, n: int = 8):
    return oai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], max_tokens=n, temperature=0
    )


def chat_ids(model_dir, contents: list[str]) -> list[list[int]]:
    """Each one-message chat's prompt ids, as the model's own chat template renders them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": c}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for c in contents
    ]


def stats(sock) -> dict:
    with uds_client(sock) as c:
        return c.get("/stats").json()


def post(sock, path: str) -> dict:
    with uds_client(sock) as c:
        r = c.post(path)
        assert r.status_code == 200, r.text
        return r.json()


def model_folder(root, model_id, model_dir):
    return root / safe_name(model_id) / fingerprint(model_dir, "kv-fp")


def backdate(path) -> None:
    t = time.time() - 3600
    os.utime(path, (t, t))


@pytest.fixture
def root(short_tmp, request):
    d = short_tmp / f"f-{request.node.name[-24:]}"
    yield d
    if d.is_dir():
        shutil.rmtree(d, ignore_errors=True)
    else:
        d.unlink(missing_ok=True)


def test_junk_in_the_cache_folder_neither_stops_the_start_nor_the_tier(
    tiny_model_dir, short_tmp, root
):
    folder = model_folder(root, "tiny", tiny_model_dir)
    folder.mkdir(parents=True)
    for name in ("x.json", "y.safetensors", "z.tmp"):  # folders under entry names: unremovable
        (folder / name).mkdir()
        backdate(folder / name)
    (folder / "bad.json").write_bytes(b"{not json")
    (folder / "lone.safetensors").write_bytes(bytes(64))
    backdate(folder / "lone.safetensors")
    sock = short_tmp / "junk.sock"
    proc = start_worker(
        tiny_model_dir, sock, "tiny", "--ssd-cache-dir", str(root), log=short_tmp / "junk.log"
    )
    try:
        oai = uds_openai(sock)
        first = ask(oai, LONG)
        assert first.choices[0].message.content
        s = stats(sock)
        assert s["cache_ssd_disabled"] == 0 and s["cache_ssd_errors"] >= 3
        assert s["cache_ssd_corrupt"] >= 1
        # The lone data file went, and the start-up line says so.
        assert s["cache_ssd_leftovers_removed"] == 1 and not (folder / "lone.safetensors").exists()
        assert "1 leftover files removed" in (short_tmp / "junk.log").read_text()
        # The tier still works next to the junk: the entry is written, and it is served.
        body = post(sock, "/admin/cache/flush")
        assert body["cache_persisted"] is True and body["cache_entries_failed"] == 0
        assert [f for f in folder.glob("*.safetensors") if f.is_file()]
        again = ask(oai, LONG)
        assert again.usage.prompt_tokens_details.cached_tokens > 0
        assert again.choices[0].message.content == first.choices[0].message.content
    finally:
        assert stop(proc) == 0


def test_an_unusable_cache_root_leaves_the_worker_on_ram(tiny_model_dir, short_tmp, root):
    root.write_bytes(b"a file where the cache root should be")
    sock = short_tmp / "noroot.sock"
    proc = start_worker(
        tiny_model_dir, sock, "tiny", "--ssd-cache-dir", str(root), log=short_tmp / "junk.log"
    )
    try:
        oai = uds_openai(sock)
        first = ask(oai, LONG)
        again = ask(oai, LONG)
        assert again.usage.prompt_tokens_details.cached_tokens > 0  # from RAM
        assert again.choices[0].message.content == first.choices[0].message.content
        assert stats(sock)["cache_ssd_disabled"] == 1
        assert post(sock, "/admin/cache/flush")["cache_persisted"] is False  # nothing can be
    finally:
        assert stop(proc) == 0


def test_an_entry_of_the_wrong_shapes_is_a_miss_and_is_deleted(tiny_model_dir, short_tmp, root):
    sock = short_tmp / "shape.sock"
    proc = start_worker(tiny_model_dir, sock, "tiny", "--ssd-cache-dir", str(root))
    try:
        oai = uds_openai(sock)
        reference = ask(oai, LONG).choices[0].message.content
        others = [
            ask(oai, f"Question {i}: what colour is lantern {i}?").choices[0].message.content
            for i in range(2)
        ]
        assert post(sock, "/admin/cache/flush")["cache_persisted"] is True
    finally:
        stop(proc)
    # Rewrite every entry with half the head dimension: intact files with a valid hash, shaped
    # for some other model (what a fingerprint collision or a foreign writer would leave).
    folder = model_folder(root, "tiny", tiny_model_dir)
    forger = SsdStore(folder, cap_bytes=1 << 30)
    metas = list(folder.glob("*.json"))
    assert metas
    for meta in metas:
        info = orjson.loads(meta.read_bytes())
        arrays = stnp.load_file(str(meta.with_suffix(".safetensors")))
        arrays.pop("__tokens__")
        bad = {k: np.ascontiguousarray(a[..., : a.shape[-1] // 2]) for k, a in arrays.items()}
        assert forger.write(info["ns"], tuple(info["tokens"]), bad, {}, info["session"])
    proc = start_worker(tiny_model_dir, sock, "tiny", "--ssd-cache-dir", str(root))
    try:
        oai = uds_openai(sock)
        prompts = [LONG] + [f"Question {i}: what colour is lantern {i}?" for i in range(2)]
        with ThreadPoolExecutor(3) as pool:  # one batch: no row may fail for another's entry
            rs = list(pool.map(lambda p: ask(oai, p), prompts))
        assert [r.choices[0].message.content for r in rs] == [reference, *others]
        # No row reuses its own (forged) entry: at most the head it shares with a sibling that
        # finished before it was admitted (threads on a loaded machine do not start together).
        ids = chat_ids(tiny_model_dir, prompts)
        for i, r in enumerate(rs):
            shared = max(common_prefix(ids[i], other) for other in ids[:i] + ids[i + 1 :])
            assert r.usage.prompt_tokens_details.cached_tokens <= shared < len(ids[i]) // 2
        s = stats(sock)
        assert s["cache_ssd_rejected"] >= 1 and s["cache_ssd_restores"] == 0
        # Deleted, not kept to fail again: the same prompt now hits what this run cached.
        again = ask(oai, LONG)
        assert again.choices[0].message.content == reference
        assert again.usage.prompt_tokens_details.cached_tokens > 0
        assert stats(sock)["cache_ssd_rejected"] == s["cache_ssd_rejected"]
    finally:
        assert stop(proc) == 0


def test_drain_reports_writes_that_did_not_land(tiny_model_dir, short_tmp, root):
    sock = short_tmp / "nospace.sock"
    # No write-behind: every entry waits in RAM for the flush and the drain.
    proc = start_worker(
        tiny_model_dir, sock, "tiny", "--ssd-cache-dir", str(root), "--cache-quiet-s", "600"
    )
    try:
        oai = uds_openai(sock)
        first = ask(oai, LONG)
        folder = model_folder(root, "tiny", tiny_model_dir)
        shutil.rmtree(folder)
        folder.write_bytes(b"")  # from now on every write fails (works as root, unlike chmod)
        flush = post(sock, "/admin/cache/flush")
        assert flush["cache_persisted"] is False
        assert flush["cache_entries_failed"] >= 1 and flush["cache_entries_written"] == 0
        s = stats(sock)
        assert s["cache_ssd_write_errors"] >= 1 and s["cache_ssd_disabled"] == 0
        again = ask(oai, LONG)  # still serving, from RAM
        assert again.choices[0].message.content == first.choices[0].message.content
        assert again.usage.prompt_tokens_details.cached_tokens > 0
        drained = post(sock, "/admin/drain")
        assert drained["cache_persisted"] is False and drained["cache_entries_failed"] >= 1
    finally:
        assert stop(proc) == 0


def test_two_ids_of_one_model_keep_their_own_folders(tiny_model_dir, short_tmp, root):
    socks = {mid: short_tmp / f"two-{mid}.sock" for mid in ("alpha", "beta")}
    procs = {
        mid: start_worker(tiny_model_dir, s, mid, "--ssd-cache-dir", str(root))
        for mid, s in socks.items()
    }
    try:
        for mid, s in socks.items():
            ask(uds_openai(s), f"{mid}: " + LONG)
            assert post(s, "/admin/cache/flush")["cache_persisted"] is True
    finally:
        for p in procs.values():
            stop(p)
    for mid in socks:
        assert list(model_folder(root, mid, tiny_model_dir).glob("*.safetensors")), mid
    # Each id's entries survive the other's start (scan, cap) and restore after a restart.
    sock = socks["alpha"]
    proc = start_worker(tiny_model_dir, sock, "alpha", "--ssd-cache-dir", str(root))
    try:
        r = ask(uds_openai(sock), "alpha: " + LONG)
        assert r.usage.prompt_tokens_details.cached_tokens > 0
        assert stats(sock)["cache_ssd_restores"] == 1
    finally:
        stop(proc)


def test_health_says_ok_only_after_the_ssd_scan(tiny_model_dir, short_tmp, root):
    folder = model_folder(root, "tiny", tiny_model_dir)
    folder.mkdir(parents=True)
    n = 3000
    for i in range(n):  # a scan with work to do: each of these is read, judged and removed
        (folder / f"{i:032x}.json").write_bytes(b"{}")
    sock = short_tmp / "ready.sock"
    cmd = [
        sys.executable,
        "-m",
        "mlxd.worker",
        "--model-path",
        str(tiny_model_dir),
        "--model-id",
        "tiny",
        "--socket",
        str(sock),
        "--ssd-cache-dir",
        str(root),
    ]
    log = short_tmp / "ready.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                with uds_client(sock, 2.0) as c:
                    if c.get("/health").status_code == 200:
                        s = c.get("/stats").json()
                        break
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        else:
            pytest.fail("the worker never became healthy")
        assert s.get("cache_ssd_corrupt") == n  # the scan had ended when /health said ok
        assert not list(folder.glob("*.json"))
    finally:
        stop(proc)


def test_a_restore_that_raises_drops_the_entry_and_runs_as_a_miss(tmp_path):
    layout = ((1, 4, 1, 4, "float32"),)
    # A two-token entry: any reuse counts here (restores normally need EARN_TOKENS saved).
    cache = PromptCache(1 << 20, tmp_path / "fp", 1 << 20, layout=layout, earn_tokens=1)
    cache.start()
    good = {"0.k": np.ones((1, 1, 2, 4), np.float32), "0.v": np.ones((1, 1, 2, 4), np.float32)}
    assert cache.ssd.write("", (1, 2), good, {}, None)
    entry = cache.ssd_candidate("", [1, 2, 3])
    assert entry is not None
    # Arrays that passed the read but break the restore (here: a layer's values are missing).
    layers, n, source = cache.fetch("", [1, 2, 3], (entry, {"0.k": good["0.k"]}))
    assert (layers, n, source) == (None, 0, "none")
    assert cache.stats()["cache_ssd_rejected"] == 1
    assert cache.ssd_candidate("", [1, 2, 3]) is None and not list((tmp_path / "fp").iterdir())
