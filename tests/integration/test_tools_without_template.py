"""Tools on a model whose chat template has no tool format (as the built-in SmolLM2's).

Without the fallback the template drops `tools` and the assistant's `tool_calls` while the
tool results still render; with it, all three reach the model as text, with a Warning.
"""

from __future__ import annotations

import re

import pytest

from procs import start_worker, stop, uds_client
from tiny_model import CHAT_TEMPLATE, build_tiny_model

# The tiny model's ChatML template with its tool parts cut out.
PLAIN_TEMPLATE = """\
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\\n' }}
{%- if message.content is string %}{{ message.content }}{%- endif %}
{{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
READ = {
    "name": "Read",
    "description": "Read a file from disk",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}
# Claude Code's second request, shaped as it sends it: a tool_use and its tool_result.
BODY = {
    "model": "plain",
    "max_tokens": 4,
    "temperature": 0,
    "tools": [READ],
    "system": "You are a coding agent.",
    "messages": [
        {"role": "user", "content": "What is in notes.txt?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me read it."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "Read",
                    "input": {"path": "notes.txt"},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "buy milk"}],
        },
    ],
}


@pytest.fixture(scope="module")
def plain_worker(tmp_path_factory, short_tmp):
    assert "tools" not in PLAIN_TEMPLATE and "tools" in CHAT_TEMPLATE
    model = build_tiny_model(tmp_path_factory.mktemp("plain") / "m", chat_template=PLAIN_TEMPLATE)
    sock = short_tmp / "plain-tools.sock"
    proc = start_worker(
        model, sock, "plain", "--context-limit", "2048", log=short_tmp / "plain-tools.log"
    )
    yield sock, short_tmp / "plain-tools.log"
    stop(proc)


def _count(http, body) -> int:
    r = http.post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"]


def test_tools_calls_and_results_reach_a_template_without_a_tool_format(plain_worker):
    sock, log = plain_worker
    with uds_client(sock) as http:
        r = http.post("/v1/messages", json=BODY)
        assert r.status_code == 200, r.text
        assert "tools" in r.headers.get("Warning", "") and "system message" in r.headers["Warning"]
        assert r.json()["content"]  # an ordinary answer still comes back
        # The tool list and the earlier call now cost prompt tokens: they are in the prompt.
        bare = {**BODY, "tools": None, "messages": BODY["messages"][:1]}
        assert _count(http, BODY) > _count(http, bare) + 100
        plain = http.post(
            "/v1/messages", json={**BODY, "tools": None, "messages": BODY["messages"][:1]}
        )
        assert plain.status_code == 200 and "Warning" not in plain.headers
    assert len(re.findall("the chat template has no tool format", log.read_text())) == 1


def test_the_fallback_prompt_holds_tools_calls_and_results(tmp_path):
    from mlx_lm.tokenizer_utils import load

    from mlxd.shared.wire.anthropic import MessagesRequest
    from mlxd.worker.chat.prompts import chat_prompt

    class M:  # what chat_prompt reads of a LoadedModel
        model_id, context_limit, max_token_bytes = "plain", 2048, 64

    path = build_tiny_model(tmp_path / "m", chat_template=PLAIN_TEMPLATE)
    M.tokenizer = load(path)
    job = MessagesRequest.model_validate(BODY).to_chat_job()
    prompt = chat_prompt(M, job.messages, job.rendered_tools)
    assert prompt.warning and "tools" not in prompt.kwargs
    text = prompt.text
    assert '"name":"Read"' in text and "Read a file from disk" in text
    assert '<tool_call>\n{"name":"Read","arguments":{"path":"notes.txt"}}\n</tool_call>' in text
    assert "<tool_response>\nbuy milk\n</tool_response>" in text
    assert (
        text.index("Let me read it.") < text.index('"arguments":{"path"') < text.index("buy milk")
    )
