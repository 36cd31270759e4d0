"""Per-model defaults, aliases and the `developer` role, without processes or a model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from agent_bodies import BILLING_HEADER

from mlxd.shared.config import ConfigError
from mlxd.shared.config_load import load_settings
from mlxd.shared.params import GenerationParams
from mlxd.shared.sampling import SamplingDefaults, resolve
from mlxd.shared.wire.ollama import ChatRequest
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.supervisor.catalog.catalog import Catalog
from mlxd.supervisor.catalog.discovery import alias_problem
from mlxd.worker.chat.prompts import prepare_messages, resolve_params


def _model(template: str = "{{ messages }}", **defaults):
    return SimpleNamespace(
        tokenizer=SimpleNamespace(chat_template=template),
        defaults=SamplingDefaults(
            resolve(defaults), defaults.get("max_tokens"), defaults.get("system")
        ),
        context_limit=100,
        vocab_size=50,
    )


DEV_CHAT = {
    "model": "m",
    "messages": [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "hi"}],
}


@pytest.mark.parametrize("wire", [ChatCompletionRequest, ChatRequest])
def test_a_developer_message_is_system_unless_the_template_knows_the_role(wire):
    job = wire.model_validate(DEV_CHAT).to_chat_job()
    plain = prepare_messages(_model(), job.messages)
    assert plain == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hi"},
    ]
    knows = "{% if m.role == 'developer' %}{{ m.content }}{% endif %}"
    assert prepare_messages(_model(knows), job.messages)[0] == {
        "role": "developer",
        "content": "Be terse.",
    }


def test_the_default_system_prompt_fills_only_a_conversation_without_one():
    m = _model(system="Answer in French.")
    user = {"role": "user", "content": "hi"}
    assert prepare_messages(m, [user]) == [{"role": "system", "content": "Answer in French."}, user]
    own = [{"role": "system", "content": "Be brief."}, user]
    assert prepare_messages(m, own) == own
    dev = [{"role": "developer", "content": "Be brief."}, user]
    assert prepare_messages(m, dev) == own  # a developer message counts as the request's own


def test_attribution_lines_leave_before_the_default_system_prompt_is_chosen():
    # A system prompt that held only Claude Code's attribution line is no system prompt:
    # the model's default fills it, as for a client that sent none.
    m = _model(system="Answer in French.")
    user = {"role": "user", "content": "hi"}
    only_line = [{"role": "system", "content": BILLING_HEADER}, user]
    assert prepare_messages(m, only_line) == [
        {"role": "system", "content": "Answer in French."},
        user,
    ]
    with_text = [{"role": "system", "content": f"{BILLING_HEADER}\n\nBe brief."}, user]
    assert prepare_messages(m, with_text) == [{"role": "system", "content": "Be brief."}, user]
    # strip_attribution_lines = false: rendered as sent
    assert prepare_messages(m, with_text, strip_attribution=False) == with_text
    assert prepare_messages(m, only_line, strip_attribution=False) == only_line


def test_request_values_win_over_the_models_defaults():
    m = _model(temperature=0.0, top_p=0.5, top_k=7, min_p=0.1, max_tokens=5)
    got = resolve_params(m, GenerationParams(), prompt_len=10)
    assert (got.temperature, got.top_p, got.top_k, got.min_p, got.max_tokens) == (
        0.0,
        0.5,
        7,
        0.1,
        5,
    )
    asked = GenerationParams(temperature=0.9, top_p=1.0, top_k=0, min_p=0.0, max_tokens=20)
    got = resolve_params(m, asked, prompt_len=10)
    assert (got.temperature, got.top_p, got.top_k, got.min_p, got.max_tokens) == (
        0.9,
        1.0,
        0,
        0.0,
        20,
    )
    # the config's max_tokens still fits the context's room
    assert resolve_params(m, GenerationParams(), prompt_len=97).max_tokens == 3


def _home(tmp_path, config: str):
    (tmp_path / "config.toml").write_text(config)
    for name in ("x", "taken"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    return load_settings({"home": str(tmp_path), "discover_hf_cache": False})


def test_aliases_resolve_to_their_model_in_the_catalog(tmp_path):
    settings = _home(tmp_path, '[models.x]\naliases = ["house"]\n')
    catalog = Catalog(settings)
    assert catalog.resolve("house").id == "x" and catalog.resolve("x").id == "x"
    assert alias_problem(settings) is None


def test_an_alias_that_is_a_discovered_models_id_is_refused(tmp_path):
    settings = _home(tmp_path, '[models.x]\naliases = ["taken"]\n')
    assert alias_problem(settings) == "model 'x': alias 'taken' is already a model's id"


def test_a_chat_template_file_is_found_relative_to_the_home(tmp_path):
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    settings = _home(tmp_path, '[models.x]\nchat_template = "t.jinja"\n')
    assert settings.for_model("x").chat_template == str(tmp_path / "t.jinja")
    inline = '[models.x]\nchat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"\n'
    (tmp_path / "config.toml").write_text(inline)
    settings = load_settings({"home": str(tmp_path)})
    assert settings.for_model("x").chat_template.startswith("{% for m")
    (tmp_path / "config.toml").write_text('[models.x]\nchat_template = "gone.jinja"\n')
    with pytest.raises(ConfigError, match="chat_template .*gone.jinja is neither a file"):
        load_settings({"home": str(tmp_path)})
