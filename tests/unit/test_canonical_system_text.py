"""Claude Code's per-session attribution line leaves system text on every surface, and only it.

The line (`x-anthropic-billing-header: cc_version=<version>.<3 hex>; ...`, recorded from Claude
Code 2.1.197 in tests/agent_bodies.py) changes from one session to the next at the prompt's
~20th token: left in, no new session could reuse the prompt cache past it.
"""

from __future__ import annotations

import copy

import pytest
from agent_bodies import BILLING_HEADER, CLAUDE_CODE_BODY

from mlxd.shared.wire.anthropic import MessagesRequest
from mlxd.shared.wire.bodies import parse_model
from mlxd.shared.wire.ollama import ChatRequest, GenerateRequest
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.shared.wire.responses import ResponsesRequest
from mlxd.worker.chat.canonical import strip_attribution, strip_attribution_lines

H = BILLING_HEADER
OTHER_SESSION = H.replace(".1c0;", ".8a5;")
PROMPT = "You are an interactive agent.\n\n  Indented,\ttabbed  \n\nLast line.  "


@pytest.mark.parametrize(
    "text, want",
    [
        (f"{H}\n\n{PROMPT}", PROMPT),  # a block of its own, joined with a blank line
        (f"{H}\n{PROMPT}", PROMPT),
        (f"A\n\n{H}\n\nB", "A\n\nB"),  # a paragraph of its own mid-text: one separator stays
        (f"A\n{H}\nB", "A\nB"),
        (f"A\n\n{H}", "A"),  # the last block: as if it had not been sent
        (f"A\n{H}\n", "A"),
        (H, ""),
        (f"{H}\r\n\r\nB", "B"),
        (f"{H}\n{OTHER_SESSION}\nB", "B"),
        (f"{H} cch=00000; cc_workload=cron;\n\nB", "B"),  # the fields Claude Code may add
        (f"{H} cc_later=1\nB", "B"),  # a field without its `;`: still the line's own
        ("x-anthropic-billing-header: any other shape\nB", "B"),
        (f"{H}You are Claude.\n\nB", "You are Claude.\n\nB"),  # parts joined with no separator
        (f"{H} You are Claude.", "You are Claude."),  # ... or with a space
    ],
)
def test_the_line_and_only_the_whitespace_it_leaves_go(text, want):
    assert strip_attribution(text) == want


@pytest.mark.parametrize(
    "text",
    [
        PROMPT,
        f"Quoted: {H}\nB",  # not at a line's start
        f" {H}\nB",
        "X-Anthropic-Billing-Header: cc_version=1;\nB",
        "",
    ],
)
def test_text_without_the_line_at_a_line_start_is_left_byte_for_byte(text):
    assert strip_attribution(text) == text


def test_a_line_of_fields_glued_without_spaces_is_read_once():
    # A client's text reaches the patterns: `ab=ab=… ;` can be split into fields in
    # exponentially many ways: a looser pattern took a second on 13 of them, here 50,000.
    glued = "ab=" * 50_000 + " ;"
    assert strip_attribution(f"{H}{glued}\nB") == f"{glued}\nB"
    assert strip_attribution(f"{H} {glued}\nB") == f"{glued}\nB"


def test_two_sessions_system_texts_become_the_same():
    first, second = (strip_attribution(f"{h}\n\n{PROMPT}") for h in (H, OTHER_SESSION))
    assert first == second == PROMPT


# -- every surface's shapes, through its own conversion to chat messages ----------------------
SYSTEM = "You are a coding agent."
USER = {"role": "user", "content": "hi"}


def _text(text: str, kind: str = "text") -> dict:
    return {"type": kind, "text": text}


# (request model, body with the line, the same body as a client would send it without)
SURFACES = {
    "anthropic system string": (
        MessagesRequest,
        {"max_tokens": 8, "system": f"{H}\n{SYSTEM}", "messages": [USER]},
        {"max_tokens": 8, "system": SYSTEM, "messages": [USER]},
    ),
    "anthropic system blocks": (
        MessagesRequest,
        {"max_tokens": 8, "system": [_text(H), _text(SYSTEM)], "messages": [USER]},
        {"max_tokens": 8, "system": [_text(SYSTEM)], "messages": [USER]},
    ),
    "anthropic system block of the line alone": (
        MessagesRequest,
        {"max_tokens": 8, "system": [_text(H)], "messages": [USER]},
        {"max_tokens": 8, "messages": [USER]},
    ),
    "anthropic mid-conversation system blocks": (
        MessagesRequest,
        {"max_tokens": 8, "messages": [USER, {"role": "system", "content": [_text(H)]}, USER]},
        {"max_tokens": 8, "messages": [USER, USER]},
    ),
    "openai system string": (
        ChatCompletionRequest,
        {"messages": [{"role": "system", "content": f"{H}\n\n{SYSTEM}"}, USER]},
        {"messages": [{"role": "system", "content": SYSTEM}, USER]},
    ),
    "openai system content parts": (
        ChatCompletionRequest,
        {"messages": [{"role": "system", "content": [_text(H), _text(SYSTEM)]}, USER]},
        {"messages": [{"role": "system", "content": [_text(SYSTEM)]}, USER]},
    ),
    "openai developer message": (
        ChatCompletionRequest,
        {"messages": [{"role": "developer", "content": f"{H}\n{SYSTEM}"}, USER]},
        {"messages": [{"role": "developer", "content": SYSTEM}, USER]},
    ),
    "responses instructions": (
        ResponsesRequest,
        {"instructions": f"{H}\n\n{SYSTEM}", "input": "hi"},
        {"instructions": SYSTEM, "input": "hi"},
    ),
    "responses developer item": (
        ResponsesRequest,
        {
            "input": [
                {"role": "developer", "content": [_text(H, "input_text")]},
                {"role": "system", "content": [_text(f"{H}\n{SYSTEM}", "input_text")]},
                {"role": "user", "content": "hi"},
            ]
        },
        {
            "input": [
                {"role": "system", "content": [_text(SYSTEM, "input_text")]},
                {"role": "user", "content": "hi"},
            ]
        },
    ),
    "ollama chat system message": (
        ChatRequest,
        {"model": "m", "messages": [{"role": "system", "content": f"{H}\n\n{SYSTEM}"}, USER]},
        {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, USER]},
    ),
    "ollama generate system": (
        GenerateRequest,
        {"model": "m", "prompt": "hi", "system": f"{H}\n{SYSTEM}"},
        {"model": "m", "prompt": "hi", "system": SYSTEM},
    ),
}


@pytest.mark.parametrize("surface", SURFACES)
def test_each_surface_renders_as_if_the_client_had_not_sent_the_line(surface):
    wire, with_line, without = SURFACES[surface]
    job = parse_model(wire, with_line).to_chat_job()
    stripped = strip_attribution_lines(job.messages)
    assert stripped == parse_model(wire, without).to_chat_job().messages
    assert H not in str(stripped)


def test_claude_codes_recorded_body_loses_only_its_first_block():
    body = copy.deepcopy(CLAUDE_CODE_BODY)
    body["system"].insert(0, {"type": "text", "text": H})
    msgs = parse_model(MessagesRequest, body).to_chat_job().messages
    assert msgs[0]["content"].startswith(H + "\n\n")
    want = parse_model(MessagesRequest, CLAUDE_CODE_BODY).to_chat_job().messages
    assert strip_attribution_lines(msgs) == want


def test_user_and_assistant_text_is_never_touched():
    msgs = [
        {"role": "user", "content": f"{H}\nwhat is this line?"},
        {"role": "assistant", "content": f"{H}\nan attribution line"},
    ]
    assert strip_attribution_lines(msgs) == msgs


def test_messages_without_the_line_are_the_same_objects():
    msgs = [{"role": "system", "content": SYSTEM}, USER, {"role": "system", "content": None}]
    out = strip_attribution_lines(msgs)
    assert all(a is b for a, b in zip(out, msgs)) and len(out) == len(msgs)
