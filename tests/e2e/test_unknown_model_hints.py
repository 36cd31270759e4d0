"""A mistyped model id gets "did you mean" on every surface, in that surface's own envelope,
through the official clients (nothing is loaded: the lookup fails before any worker)."""

from __future__ import annotations

import subprocess
import sys

import anthropic
import ollama
import openai
import pytest

HINT = "(did you mean 'tiny-chat'?)"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def daemon(make_module_daemon, tiny_model_dir):
    return make_module_daemon(models={"tiny-chat": tiny_model_dir})


def test_openai_chat_and_responses_suggest_the_closest_id(daemon):
    client = daemon.openai()
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert exc.value.body["message"] == f"The model 'tiny' does not exist {HINT}"
    assert exc.value.body["code"] == "model_not_found" and exc.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="tiny-chta", input="hi", max_output_tokens=2)
    assert exc.value.body["message"] == f"The model 'tiny-chta' does not exist {HINT}"
    with pytest.raises(openai.NotFoundError) as exc:
        client.models.retrieve("Tiny-Chat")
    assert HINT in exc.value.body["message"]


def test_anthropic_messages_suggest_in_their_envelope(daemon):
    client = anthropic.Anthropic(base_url=daemon.url, api_key="none", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as exc:
        client.messages.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert exc.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": f"The model 'tiny' does not exist {HINT}"},
    }


def test_ollama_suggests_a_name_with_its_tag(daemon):
    client = ollama.Client(host=daemon.url)
    for name in ("tiny", "tiny:latest", "tiny-chta:latest"):
        with pytest.raises(ollama.ResponseError) as exc:
            client.chat(model=name, messages=MESSAGES)
        assert exc.value.status_code == 404
        assert exc.value.error == f"model '{name}' not found (did you mean 'tiny-chat:latest'?)"
    with pytest.raises(ollama.ResponseError) as exc:
        client.show("tiny")
    assert "(did you mean 'tiny-chat:latest'?)" in exc.value.error


def test_mlxctl_run_and_load_suggest_the_closest_id(daemon):
    for verb in (["run", "tiny", "hi"], ["load", "tiny"]):
        p = subprocess.run(
            [sys.executable, "-m", "mlxd.supervisor.ctl.mlxctl", "--url", daemon.url, *verb],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 1
        assert p.stderr == f"mlxctl: 404: The model 'tiny' does not exist {HINT}\n"
