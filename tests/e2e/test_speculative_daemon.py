"""Speculative decoding through the daemon: a model with a draft answers as the same model
without one, its next turn still hits the prompt cache exactly, /metrics counts the drafts,
and a draft of another tokenizer is refused at load while the other models serve."""

from __future__ import annotations

import re
import shutil

import pytest
from tokenizers import Tokenizer

CONFIG = """
[models.a]
speculative = "draft"
draft_model = "b"
num_draft_tokens = 3

[models.c]
speculative = "draft"
draft_model = "other-tokenizer"
"""


@pytest.fixture(scope="module")
def daemon(module_daemon, tiny_model_dir, tiny_model_dir_b, tmp_path_factory):
    bad = tmp_path_factory.mktemp("draft") / "other-tokenizer"
    shutil.copytree(tiny_model_dir, bad)
    tok = Tokenizer.from_file(str(bad / "tokenizer.json"))
    tok.add_tokens(["<|not_in_the_target|>"])
    tok.save(str(bad / "tokenizer.json"))
    models = {
        "a": tiny_model_dir,
        "plain": tiny_model_dir,
        "b": tiny_model_dir_b,
        "c": tiny_model_dir,
        "other-tokenizer": bad,
    }
    return module_daemon(models=models, config=CONFIG)


def _turn(client, model, messages):
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
    return r.choices[0].message.content, r.usage


def test_a_drafted_model_answers_as_without_and_its_next_turn_hits_the_cache(daemon):
    client = daemon.openai()
    first = [{"role": "user", "content": "Write the function again: def f(x): return x + 1"}]
    fast, _ = _turn(client, "a", first)
    plain, _ = _turn(client, "plain", first)
    assert fast == plain
    second = [*first, {"role": "assistant", "content": fast}, {"role": "user", "content": "Again."}]
    fast2, usage = _turn(client, "a", second)
    plain2, _ = _turn(client, "plain", second)
    assert fast2 == plain2
    assert usage.prompt_tokens_details.cached_tokens > 0  # the trimmed cache was reused

    def drafted():
        text = daemon.http.get("/metrics").text
        m = re.search(r'mlxd_spec_drafted_tokens_total\{model="a"\} (\S+)', text)
        return m and float(m.group(1)) > 0

    daemon.wait_for(drafted, what="drafted tokens in /metrics")


def test_a_draft_with_another_tokenizer_is_refused_and_the_others_serve(daemon):
    r = daemon.http.post(
        "/v1/chat/completions",
        json={"model": "c", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 503 and "/admin/models/c" in r.json()["error"]["message"]
    why = daemon.http.get("/admin/models/c").json()
    assert why["state"] == "fatal" and "same tokenizer" in why["last_error"]
    ok, _ = _turn(daemon.openai(), "plain", [{"role": "user", "content": "hi"}])
    assert isinstance(ok, str)
