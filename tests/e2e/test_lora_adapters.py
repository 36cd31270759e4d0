"""LoRA adapters through the daemon: named by a configured id, by "model:adapter" and by the
`adapter` field; listed; mounted and unmounted through /admin while requests run; a bad one
refused; and the prompt cache never serves a base entry to an adapter row."""

from __future__ import annotations

import threading

import anthropic
import ollama
import pytest
from lora_adapters import make_adapter

PROMPT = "Tell me about the weather in the mountains today, in some detail please"


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    dest = tmp_path_factory.mktemp("e2e-adapters")
    return {n: make_adapter(tiny_model_dir, dest, n) for n in ("qv", "mlp", "all")}


@pytest.fixture(scope="module")
def daemon(make_module_daemon, tiny_model_dir, adapters):
    config = f"""
[models.tiny]
adapters = {{ qv = "{adapters["qv"]}" }}

[models.sqlbot]
base = "tiny"
adapter_path = "{adapters["mlp"]}"

[models.emb]
type = "embedding"
"""
    return make_module_daemon(models={"tiny": tiny_model_dir, "emb": tiny_model_dir}, config=config)


def ask(d, model: str, content: str = PROMPT, **extra):
    r = d.openai().chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=12,
        temperature=0,
        extra_body=extra or None,
    )
    return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens


def test_adapters_are_listed_and_each_name_reaches_its_adapter_on_one_worker(daemon):
    ids = {c["id"] for c in daemon.http.get("/v1/models").json()["data"]}
    assert {"tiny", "tiny:qv", "sqlbot"} <= ids
    base, _ = ask(daemon, "tiny")
    qv, _ = ask(daemon, "tiny:qv")
    sql, _ = ask(daemon, "sqlbot")
    assert len({base, qv, sql}) == 3  # each adapter changes what the model writes
    assert ask(daemon, "tiny", adapter="sqlbot")[0] == sql
    assert len(daemon.worker_pids()) == 1  # one worker, one copy of the base weights
    row = daemon.http.get("/admin/models/tiny").json()
    assert row["adapters"] == ["sqlbot", "tiny:qv"]
    missing = daemon.http.post(
        "/v1/chat/completions",
        json={"model": "tiny:nope", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]


def test_a_base_entry_never_serves_an_adapter_row(daemon):
    text = "A different question: how do rivers form, and where do they end?"
    ask(daemon, "tiny", text)
    _, base_hit = ask(daemon, "tiny", text)
    _, cached = ask(daemon, "tiny:qv", text)
    # At most the chat template's opening, from this adapter's own earlier rows.
    assert cached < base_hit // 2
    _, again = ask(daemon, "tiny:qv", text)
    assert again > 0  # the adapter's own entry does serve it


def test_mount_and_unmount_under_load_fail_no_request(daemon, adapters, tmp_path):
    errors: list = []
    stop = threading.Event()

    def load(model: str) -> None:
        while not stop.is_set():
            try:
                ask(daemon, model, PROMPT + " " + model)
            except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
                errors.append(exc)

    threads = [threading.Thread(target=load, args=(m,)) for m in ("tiny", "tiny:qv", "sqlbot")]
    for t in threads:
        t.start()
    try:
        r = daemon.http.post(
            "/admin/models/tiny/adapters", json={"name": "all", "path": str(adapters["all"])}
        )
        assert r.status_code == 200, r.text
        assert r.json()["id"] == "tiny:all"
        assert ask(daemon, "tiny:all")[0] != ask(daemon, "tiny")[0]
        bad = tmp_path / "bad"
        bad.mkdir()
        (bad / "adapter_config.json").write_text('{"fine_tune_type": "lora"}')
        (bad / "adapters.safetensors").write_bytes(b"not safetensors")
        r = daemon.http.post("/admin/models/tiny/adapters", json={"name": "bad", "path": str(bad)})
        assert r.status_code == 400 and "scale" in r.json()["error"]["message"]
        r = daemon.http.delete("/admin/models/tiny/adapters/all")
        assert r.status_code == 200, r.text
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert errors == []
    gone = daemon.http.post(
        "/v1/chat/completions",
        json={"model": "tiny:all", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert gone.status_code == 404


def _status(call) -> tuple[int, str]:
    try:
        call()
    except ollama.ResponseError as exc:
        return exc.status_code, exc.error
    except anthropic.APIStatusError as exc:
        return exc.status_code, exc.message
    return 200, ""


def test_an_adapters_name_never_reaches_its_base_model_where_a_whole_model_is_meant(
    daemon, adapters, tmp_path
):
    """Found by a black-box probe (2026-12-07): Ollama's delete of "tiny:qv" (an adapter) or
    of "tiny:nope" (a typo) deleted the model tiny itself; copy, create and show of an unknown
    adapter acted on the base; embeddings and count_tokens ignored the adapter named."""
    client = ollama.Client(host=daemon.url, timeout=60)
    for name in ("tiny:qv", "sqlbot"):  # mounted: a 400 saying how to unmount it
        status, error = _status(lambda n=name: client.delete(n))
        assert status == 400 and "mlxctl unmount tiny" in error, (name, error)
    status, error = _status(lambda: client.delete("tiny:nope"))
    assert status == 404 and "No adapter named 'nope'" in error
    status, error = _status(lambda: client.copy("tiny:qv", "tiny-copy"))
    assert status == 400 and "whole models" in error
    status, _ = _status(lambda: client.copy("tiny:nope", "tiny-copy"))
    assert status == 404
    status, _ = _status(lambda: client.create("tiny-new", from_="tiny:nope"))
    assert status == 404
    assert client.show("tiny:qv").details is not None  # a mounted adapter shows its base
    status, _ = _status(lambda: client.show("tiny:nope"))
    assert status == 404
    # A new model may not take a mounted adapter's name (a model id wins over an adapter).
    status, error = _status(lambda: client.create("tiny:qv", from_="tiny"))
    assert status == 400 and "mounted on 'tiny'" in error
    status, error = _status(lambda: client.copy("tiny", "tiny:qv"))
    assert status == 400 and "mounted on 'tiny'" in error
    status, error = _status(lambda: client.copy("tiny", "sqlbot"))  # a configured adapter's id
    assert status == 400 and "config.toml" in error
    assert client.show("emb").capabilities == ["embedding"]  # not offered as a chat model
    # A typo'd adapter neither unloads its model (Ollama's keep_alive 0, `ollama stop`) nor
    # loads it to be refused (a review, 2026-12-07).
    ask(daemon, "tiny")
    pids = daemon.worker_pids("tiny")
    status, _ = _status(lambda: client.generate("tiny:nope", keep_alive=0))
    assert status == 404 and daemon.worker_pids("tiny") == pids
    # The model is still there and answers.
    assert "tiny:latest" in {m.model for m in client.list().models}
    assert ask(daemon, "tiny")[0]

    # Embeddings are the base model's: an adapter's name is refused, not ignored.
    status, error = _status(lambda: client.embed("emb:nope", "hello"))
    assert status == 404
    r = daemon.http.post("/v1/embeddings", json={"model": "emb", "adapter": "x", "input": "hi"})
    assert r.status_code == 404 and "No adapter named 'x'" in r.json()["error"]["message"]
    r = daemon.http.post("/api/embed", json={"model": "emb", "adapter": "x", "input": "hi"})
    assert r.status_code == 400 and "base model" in r.json()["error"]
    r = daemon.http.post(
        "/admin/models/emb/adapters", json={"name": "q", "path": str(adapters["qv"])}
    )
    assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]

    # count_tokens checks the adapter as /v1/messages does.
    messages = anthropic.Anthropic(base_url=daemon.url, api_key="none", max_retries=0).messages
    body = {"messages": [{"role": "user", "content": "hi"}]}
    status, _ = _status(lambda: messages.count_tokens(model="tiny:nope", **body))
    assert status == 404
    assert messages.count_tokens(model="tiny:qv", **body).input_tokens > 0
