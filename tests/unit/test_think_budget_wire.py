"""Each surface's thinking budget becomes one engine budget; bad ones are 400s naming the field."""

from __future__ import annotations

import pytest

from mlxd.shared.errors import BadRequest
from mlxd.shared.params import EFFORT_BUDGETS, EFFORTS, GenerationParams
from mlxd.shared.wire.anthropic import CountTokensRequest, MessagesRequest
from mlxd.shared.wire.bodies import parse_model
from mlxd.shared.wire.ollama import ChatRequest
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.shared.wire.responses import ResponsesRequest

USER = [{"role": "user", "content": "hi"}]


def messages(**body) -> GenerationParams:
    req = parse_model(MessagesRequest, {"max_tokens": 4096, "messages": USER, **body})
    return req.to_chat_job().params


@pytest.mark.parametrize(
    "max_tokens, effort, budget",
    [
        (40, "low", 10),  # a share of a small max_tokens leaves room for the answer
        (100_000, "low", 1024),  # a fixed count caps it on a long context
        (8000, "medium", 4000),
        (100_000, "high", 16384),
        (100, "none", 0),
        (100, "minimal", 12),
        (100, "max", None),
        (100, None, None),
    ],
)
def test_effort_table(max_tokens, effort, budget):
    assert GenerationParams(max_tokens=max_tokens, reasoning_effort=effort).thinking_budget() == (
        budget
    )


def test_every_effort_has_a_row_and_an_explicit_budget_wins():
    assert set(EFFORTS) == set(EFFORT_BUDGETS)
    p = GenerationParams(max_tokens=100, reasoning_budget=70, reasoning_effort="low")
    assert p.thinking_budget() == 70


def test_anthropic_budget_tokens_is_the_budget():
    assert messages(thinking={"type": "enabled", "budget_tokens": 2048}).reasoning_budget == 2048
    for off in ({"type": "disabled"}, {"type": "adaptive"}, None):
        assert messages(thinking=off).reasoning_budget is None
    p = messages(thinking={"type": "adaptive"}, output_config={"effort": "low"})
    assert p.reasoning_effort == "low"


@pytest.mark.parametrize(
    "body, param",
    [
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1023}},
            "thinking.enabled.budget_tokens",
        ),
        ({"thinking": {"type": "enabled"}}, "thinking.enabled.budget_tokens"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": "2k"}},
            "thinking.enabled.budget_tokens",
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "max_tokens"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ],
)
def test_anthropic_bad_budgets_are_400s(body, param):
    with pytest.raises(BadRequest) as exc:
        messages(**body)
    assert exc.value.param == param


def test_anthropic_count_tokens_takes_a_budget_without_max_tokens():
    body = {"messages": USER, "thinking": {"type": "enabled", "budget_tokens": 31999}}
    assert parse_model(CountTokensRequest, body).to_chat_job().params.reasoning_budget == 31999


def test_openai_chat_effort_and_budget():
    req = parse_model(
        ChatCompletionRequest,
        {"messages": USER, "reasoning_effort": "high", "thinking_token_budget": 300},
    )
    job = req.to_chat_job()
    assert (job.params.reasoning_effort, job.params.reasoning_budget) == ("high", 300)
    assert job.template_kwargs == {"reasoning_effort": "high"}  # gpt-oss templates read it
    for bad in ({"reasoning_effort": "huge"}, {"thinking_token_budget": -1}):
        with pytest.raises(BadRequest):
            parse_model(ChatCompletionRequest, {"messages": USER, **bad})


def test_responses_effort_splits_max_output_tokens():
    req = parse_model(
        ResponsesRequest,
        {"input": "hi", "max_output_tokens": 400, "reasoning": {"effort": "medium"}},
    )
    job = req.to_chat_job()
    assert job.params.thinking_budget() == 200
    assert job.template_kwargs == {"reasoning_effort": "medium"}
    bad = parse_model(ResponsesRequest, {"input": "hi", "reasoning": {"effort": "lots"}})
    with pytest.raises(BadRequest) as exc:
        bad.to_chat_job()
    assert exc.value.param == "reasoning.effort"


@pytest.mark.parametrize(
    "think, effort", [("low", "low"), ("medium", "medium"), ("high", "high"), (True, None)]
)
def test_ollama_think_levels_are_efforts(think, effort):
    req = parse_model(ChatRequest, {"model": "m", "messages": USER, "think": think})
    assert req.to_chat_job().params.reasoning_effort == effort
