"""Per-model defaults from config.toml, aliases and the `developer` role, through one real
daemon: model "a" has sampling defaults, a system prompt and aliases; model "b" has its own
chat template."""

from __future__ import annotations

import subprocess
import sys

import ollama
import pytest

SYSTEM = "You are a careful assistant who answers every question in one short, plain sentence."
# "b" renders only the last message, between fixed words: its prompt is exactly this text.
TEMPLATE = "Q: {{ messages[-1]['content'] }}\nA:"
TEMPLATE_TOML = TEMPLATE.replace("\n", "\\n")  # as a TOML basic string
CONFIG = f"""
[models.a]
temperature = 0
max_tokens = 8
system = "{SYSTEM}"
aliases = ["tiny", "house-model"]

[models.b]
chat_template = "{TEMPLATE_TOML}"
"""


@pytest.fixture(scope="module")
def daemon(module_daemon):
    return module_daemon(config=CONFIG)


def _chat(client, messages, model="a", **kw):
    return client.chat.completions.create(model=model, messages=messages, **kw)


def test_config_sampling_defaults_apply_and_a_request_overrides_them(daemon):
    client = daemon.openai()
    msgs = [{"role": "user", "content": "Tell me a story about a ship."}]
    first, second = _chat(client, msgs), _chat(client, msgs)
    # temperature 0 from the config: two unseeded requests agree; max_tokens 8 caps both
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.usage.completion_tokens <= 8
    greedy = first.choices[0].message.content
    hot = {
        _chat(client, msgs, temperature=2.0, top_p=1.0, seed=s).choices[0].message.content
        for s in (1, 2, 3)
    }
    assert hot - {greedy}, "the request's temperature did not replace the config's 0"
    longer = _chat(client, msgs, max_tokens=12, temperature=2.0, seed=1)
    assert longer.usage.completion_tokens > 8 or longer.choices[0].finish_reason == "stop"


def test_the_default_system_prompt_reaches_the_template_unless_the_request_has_one(daemon):
    client = daemon.openai()
    user = {"role": "user", "content": "hi"}
    silent = _chat(client, [user], max_tokens=1).usage.prompt_tokens
    explicit = _chat(client, [{"role": "system", "content": SYSTEM}, user], max_tokens=1)
    own = _chat(client, [{"role": "system", "content": "Be brief."}, user], max_tokens=1)
    assert silent == explicit.usage.prompt_tokens
    assert own.usage.prompt_tokens < silent  # the request's own system prompt replaced it


def test_a_configured_chat_template_replaces_the_folders(daemon):
    client = daemon.openai()
    chat = _chat(client, [{"role": "user", "content": "hello there"}], model="b", max_tokens=1)
    raw = client.completions.create(model="b", prompt="Q: hello there\nA:", max_tokens=1)
    assert chat.usage.prompt_tokens == raw.usage.prompt_tokens
    folder = _chat(client, [{"role": "user", "content": "hello there"}], model="a", max_tokens=1)
    assert folder.usage.prompt_tokens != chat.usage.prompt_tokens


def test_aliases_route_to_their_model_and_only_ids_are_listed(daemon):
    client = daemon.openai()
    by_alias = _chat(client, [{"role": "user", "content": "hi"}], model="tiny")
    by_id = _chat(client, [{"role": "user", "content": "hi"}], model="a")
    assert by_alias.choices[0].message.content == by_id.choices[0].message.content
    ids = {m.id for m in client.models.list()}
    assert ids == {"a", "b"}
    shown = daemon.http.get("/admin/models/house-model").json()
    assert shown["id"] == "a"
    assert shown["settings"]["aliases"] == ["tiny", "house-model"]
    assert shown["settings"]["temperature"] == 0 and shown["settings"]["max_tokens"] == 8
    assert shown["settings"]["system"] == SYSTEM
    text = subprocess.run(
        [sys.executable, "-m", "mlxd.supervisor.ctl.mlxctl", "--url", daemon.url, "show", "a"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert f"  {'temperature':<22} 0.0\n" in text and "tiny, house-model" in text
    assert f"  {'system':<22} {SYSTEM[:59]}…" in text  # cut to one line


def test_a_developer_message_renders_as_system_on_chat_and_ollama(daemon):
    as_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    as_developer = [{**as_system[0], "role": "developer"}, as_system[1]]
    client = daemon.openai()
    chat = [_chat(client, m, max_tokens=1).usage.prompt_tokens for m in (as_system, as_developer)]
    assert chat[0] == chat[1]
    o = ollama.Client(host=daemon.url, timeout=120)
    counts = [
        o.chat(model="a", messages=m, options={"num_predict": 1}).prompt_eval_count
        for m in (as_system, as_developer)
    ]
    assert counts[0] == counts[1]


def test_ollama_show_lists_the_defaults_a_silent_request_gets(daemon):
    shown = ollama.Client(host=daemon.url).show("a")
    params = dict(line.split(None, 1) for line in shown.parameters.splitlines())
    assert float(params["temperature"]) == 0.0  # the config section's, not the folder's 1.0
    assert float(params["top_p"]) == 1.0 and int(params["top_k"]) == 0  # built-ins
    assert "PARAMETER temperature 0.0" in shown.modelfile
