"""Models managed through Ollama's API on a real daemon, with the official `ollama` client and a
local stand-in for the Hugging Face hub (tests/fake_hub.py, reached through HF_ENDPOINT: no
network beyond loopback): pull with progress, a dropped connection resumed, a cancelled pull
that goes on where it stopped, a damaged file, a full disk (a real 1 MiB tmpfs where it can be
mounted; tests/unit/test_model_store_parts.py injects the free space everywhere), create from
a GGUF, copy, and delete of a loaded model (docs/api.md, "Managing models").
"""

from __future__ import annotations

import shutil
import subprocess
import threading

import httpx
import ollama
import pytest
from fake_hub import FakeHub

SAFETENSORS = "model.safetensors"


@pytest.fixture(scope="module")
def hub(tiny_model_dir, tiny_model_dir_b):
    h = FakeHub()
    for repo in ("test-org/tiny", "test-org/held", "test-org/broken", "test-org/big"):
        h.add(repo, tiny_model_dir)
    h.add("mlx-community/Qwen3-0.6B-4bit", tiny_model_dir_b)  # what "qwen3:0.6b" means
    h.add("test-org/gguf-only", files={"tiny.gguf": b"GGUF"})
    yield h
    h.close()


@pytest.fixture(scope="module")
def daemon(make_module_daemon, hub, tiny_model_dir, tmp_path_factory):
    hf_home = tmp_path_factory.mktemp("hf-home")  # never the user's cache or token
    config = f'[models.cfg]\npath = "{tiny_model_dir}"\n'
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home), "HF_HUB_DISABLE_TELEMETRY": "1"}
    return make_module_daemon(config=config, env=env)


@pytest.fixture(scope="module")
def client(daemon):
    return ollama.Client(host=daemon.url, timeout=120)


def names(client) -> set[str]:
    return {m.model for m in client.list().models}


def refusal(call) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as info:
        call()
    return info.value


def test_a_pull_streams_progress_and_goes_on_after_a_dropped_connection(daemon, client, hub):
    hub.drop_once.add(("test-org/tiny", SAFETENSORS))
    lines = list(client.pull("test-org/tiny", stream=True))
    statuses = [x.status for x in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert statuses[-3:-1] == ["verifying sha256 digest", "writing manifest"]
    weights = [x for x in lines if x.status == f"pulling {SAFETENSORS}"]
    assert weights[-1].completed == weights[-1].total > 0
    assert weights[0].digest.startswith("sha256:")
    assert [x.completed for x in weights] == sorted(x.completed for x in weights)
    # the connection broke halfway: the rest came with a Range request, not from byte 0
    ranges = hub.downloads("test-org/tiny", SAFETENSORS)
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    assert "test-org/tiny:latest" in names(client)
    assert not (daemon.home / "models" / ".downloads").exists()
    assert client.pull("test-org/tiny").status == "success"  # up to date: nothing downloaded
    assert len(hub.downloads("test-org/tiny", SAFETENSORS)) == 2


def test_table_names_and_what_cannot_be_pulled(daemon, client):
    assert client.pull("qwen3:0.6b").status == "success"
    assert "qwen3:0.6b" in names(client)
    # What `ollama run qwen3:0.6b` sends next: the name:tag is the model, never an adapter.
    said = client.chat(
        "qwen3:0.6b", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 3}
    )
    assert said.done and said.model == "qwen3:0.6b"
    e = refusal(lambda: client.pull("llava:7b"))
    assert e.status_code == 400 and "qwen3:0.6b" in e.error  # the table, named
    e = refusal(lambda: client.pull("test-org/missing"))
    assert e.status_code == 404 and "not found on Hugging Face" in e.error
    e = refusal(lambda: client.pull("test-org/gguf-only"))
    assert e.status_code == 400 and "no config.json" in e.error
    body = {"model": "test-org/tiny", "revision": "v9", "stream": False}  # mlxd's own field
    r = daemon.http.post("/api/pull", json=body)
    assert r.status_code == 404 and r.json() == {
        "error": "'test-org/tiny' has no such revision on Hugging Face"
    }


def test_a_cancelled_pull_goes_on_where_it_stopped(daemon, client, hub):
    key = ("test-org/held", SAFETENSORS)
    hub.hold[key] = held = threading.Event()
    body = {"model": "test-org/held"}
    with httpx.Client(base_url=daemon.url, timeout=30) as http:
        with http.stream("POST", "/api/pull", json=body) as r:
            for line in r.iter_lines():
                if SAFETENSORS in line and '"completed":0' not in line:
                    break  # some bytes of the weights came; the rest is held back
            assert "test-org/held:latest" not in names(client)  # half a model is no model
        # the client left: the daemon cancels the pull, keeping the bytes it has
        daemon.wait_for(lambda: "pull of model=test-org/held cancelled" in daemon.logs())
    held.set()
    assert client.pull("test-org/held").status == "success"
    ranges = hub.downloads("test-org/held", SAFETENSORS)
    assert ranges[0] is None and ranges[-1].startswith("bytes=") and ranges[-1] != "bytes=0-"
    assert "test-org/held:latest" in names(client)


def test_a_damaged_file_is_refused_then_downloaded_again(daemon, client, hub):
    hub.corrupt.add(("test-org/broken", SAFETENSORS))
    e = refusal(lambda: client.pull("test-org/broken"))
    assert e.status_code == 502 and "does not match its checksum" in e.error
    assert "test-org/broken:latest" not in names(client)
    hub.corrupt.clear()
    assert client.pull("test-org/broken").status == "success"
    assert len(hub.downloads("test-org/broken", "tokenizer.json")) == 1  # only the bad file again


def test_a_full_disk_refuses_the_pull_before_it_starts(daemon, client, hub):
    work = daemon.home / "models" / ".downloads"
    work.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(work)]
    if shutil.which("mount") is None or subprocess.run(mount, capture_output=True).returncode:
        work.rmdir()
        pytest.skip("cannot mount a tmpfs here (root only): the unit test injects free space")
    try:
        e = refusal(lambda: client.pull("test-org/big"))
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)
    assert e.status_code == 413 and "not enough disk space" in e.error and "free" in e.error
    assert hub.downloads("test-org/big", SAFETENSORS) == []  # nothing was downloaded


def test_create_from_a_gguf_serves_it_and_delete_unloads_it_first(daemon, client, tmp_path):
    from gguf_fixtures import write_gguf

    gguf = tmp_path / "tiny.gguf"
    write_gguf(gguf, "llama")
    steps = list(client.create("made", from_=str(gguf), parameters={"temperature": 0}, stream=True))
    assert steps[0].status == "importing tiny.gguf" and steps[-1].status == "success"
    assert not any(str(daemon.home) in s.status for s in steps)  # no path of the daemon's
    assert "made:latest" in names(client)
    assert "PARAMETER temperature 0" in client.show("made").modelfile
    reply = client.chat("made", [{"role": "user", "content": "hi"}], options={"num_predict": 2})
    assert reply.done and "made:latest" in {m.model for m in client.ps().models}
    pid = daemon.worker_pids("made")
    assert client.delete("made").status == "success"  # loaded: unloaded first, then deleted
    assert "made:latest" not in names(client) and daemon.worker_pids("made") == []
    assert pid and not (daemon.home / "models" / "made").exists()
    e = refusal(lambda: client.create("bad", from_=str(tmp_path / "nothing.gguf")))
    assert e.status_code == 400 and "neither a GGUF file nor a model folder" in e.error


def test_copy_create_from_a_model_and_what_is_not_deleted(daemon, client):
    assert client.copy("b", "b-copy").status == "success"
    made = client.create("b-terse", from_="b", system="Be terse.", parameters={"num_ctx": 256})
    assert made.status == "success"
    shown = client.show("b-terse")
    assert 'SYSTEM "Be terse."' in shown.modelfile
    assert {"b-copy:latest", "b-terse:latest"} <= names(client)
    e = refusal(lambda: client.create("x", from_="b", parameters={"stop": ["<|im_end|>"]}))
    assert e.status_code == 400 and "PARAMETER stop is not supported" in e.error
    e = refusal(lambda: client.create("x", from_="b", template="{{ .Prompt }}"))
    assert e.status_code == 400 and "Go template" in e.error
    e = refusal(lambda: client.delete("cfg"))  # a configured path is not mlxd's to delete
    assert e.status_code == 400 and "config.toml" in e.error
    e = refusal(lambda: client.delete("nope"))
    assert e.status_code == 404


def test_mlxctl_pull_shows_the_same_progress_through_the_daemon(daemon, capsys):
    from mlxd.supervisor.ctl.mlxctl import main as mlxctl

    assert mlxctl(["--url", daemon.url, "--json", "pull", "test-org/tiny"]) == 0
    out = capsys.readouterr()
    assert '"via"' in out.out and "pulling manifest" in out.err and "success" in out.err
    assert mlxctl(["--url", daemon.url, "pull", "test-org/missing"]) == 1
    assert "404: 'test-org/missing' was not found" in capsys.readouterr().err
