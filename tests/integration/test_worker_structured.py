"""Structured output, tool calls and reasoning on the worker, through the openai SDK.

The tiny model's weights are random, so its free text is nonsense: every test that needs a
particular output forces it with a constraint (guided_regex, a JSON schema, tool_choice). That
is the feature under test too: whatever the model would say, the grammar decides.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from procs import CONTEXT_LIMIT, start_worker, stop

MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "summary": {"type": "string", "maxLength": 12},
        "rain": {"type": "boolean"},
        # Bounded on purpose: a random model writes integers of a hundred digits.
        "days": {"type": "array", "items": {"enum": ["mon", "tue", "wed"]}, "maxItems": 3},
    },
    "required": ["city", "summary", "rain", "days"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}
# The exact tool-call text of the template's format, forced with a regex.
PARIS_CALL = re.escape(
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def worker(tiny_model_dir, short_tmp):
    # Our own worker without the SSD cache tier: rows written here must not turn into cache
    # hits for other modules' workers on the same model.
    sock = short_tmp / "structured.sock"
    proc = start_worker(
        tiny_model_dir,
        sock,
        "tiny",
        "--context-limit",
        str(CONTEXT_LIMIT),
        "--no-ssd-cache",
        log=short_tmp / "structured.log",
    )
    yield sock
    stop(proc)


def chat(oai, **kw):
    return oai.chat.completions.create(
        model="tiny", messages=kw.pop("messages", MSG), max_tokens=kw.pop("max_tokens", None), **kw
    )


def test_json_schema_holds_for_every_concurrent_request(oai):
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True},
    }
    with ThreadPoolExecutor(6) as pool:
        results = list(
            pool.map(
                lambda i: chat(
                    oai,
                    response_format=fmt,
                    temperature=1.0,
                    seed=i,
                    max_tokens=300,
                    messages=[{"role": "user", "content": f"Report {i}"}],
                ),
                range(6),
            )
        )
    for r in results:
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert len({r.choices[0].message.content for r in results}) > 1  # sampled, not fixed


def test_json_object_choice_regex_and_grammar(oai):
    r = chat(oai, response_format={"type": "json_object"}, max_tokens=400)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # an unbounded object may run out of tokens; it is still a JSON object's prefix
        assert r.choices[0].message.content.startswith("{")
    choices = ["sunny", "rainy", "foggy"]
    assert chat(oai, extra_body={"guided_choice": choices}).choices[0].message.content in choices
    r = chat(oai, extra_body={"guided_regex": r"[A-Z][a-z]{2,6} [0-9]{2}"})
    assert re.fullmatch(r"[A-Z][a-z]{2,6} [0-9]{2}", r.choices[0].message.content)
    grammar = 'root ::= answer " " unit\nanswer ::= [1-9] [0-9]?\nunit ::= "km" | "mi"'
    r = chat(oai, extra_body={"guided_grammar": grammar})
    assert re.fullmatch(r"[1-9][0-9]? (km|mi)", r.choices[0].message.content)


def test_a_think_marker_inside_a_constrained_answer_stays_in_the_answer(oai):
    # A grammar's answer may spell a reasoning block first (the test below), but "<think>"
    # written inside the answer (a JSON string may hold it; the tiny random model wrote one
    # there) is the answer's text, not the start of reasoning.
    r = chat(oai, extra_body={"guided_regex": r'\{"a": "<think>[a-z]{2,4}"\}'})
    message = r.choices[0].message
    assert re.fullmatch(r'\{"a": "<think>[a-z]{2,4}"\}', message.content)
    assert json.loads(message.content)["a"].startswith("<think>")
    assert not getattr(message, "reasoning_content", None)


def test_completions_accept_constraints_too(oai):
    r = oai.completions.create(
        model="tiny",
        prompt="The answer:",
        max_tokens=20,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_grammar": 'root ::= "(" root ")" | "x"'},  # recursive: not a regular language
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            }
        },
    ],
)
def test_uncompilable_constraint_degrades_with_a_warning(http, extra):
    for stream in (False, True):
        r = http.post(
            "/v1/chat/completions",
            json={"messages": MSG, "max_tokens": 4, "stream": stream, **extra},
        )
        assert r.status_code == 200, r.text
        assert r.headers["warning"].startswith('299 mlxd "')
        assert "system prompt" in r.headers["warning"]


def test_tool_call_is_parsed_into_tool_calls(oai):
    r = chat(oai, tools=[WEATHER], extra_body={"guided_regex": PARIS_CALL})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_named_tool_choice_is_enforced_and_streamed_as_tool_call_deltas(oai):
    # Seeded: the tiny vocabulary spells the call in ~60 tokens, a number that varies with
    # sampling, and the two tools leave ~68 of the 512-token context; unseeded, about one
    # run in 20 reached the context's end inside the end tag (finish_reason "length").
    chunks = list(
        chat(
            oai,
            tools=[WEATHER, CLOCK],
            stream=True,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            seed=3,
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    # the call's id and name first, then its arguments as they are written
    assert {d.index for d in deltas} == {0} and len(deltas) >= 3
    assert deltas[0].function.name == "get_time" and deltas[0].id.startswith("call_")
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    arguments = "".join(d.function.arguments for d in deltas)
    jsonschema.validate(json.loads(arguments), CLOCK["function"]["parameters"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_required_tool_choice_calls_one_of_the_tools(oai):
    r = chat(oai, tools=[WEATHER, CLOCK], tool_choice="required", temperature=1.0, seed=3)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "get_time")


def test_a_forced_call_whose_schema_no_grammar_expresses_is_asked_for_in_words(oai):
    """Compiled in the child since 2026-12-07: an inexpressible schema comes back from there
    and the call is asked for in the system prompt, with a Warning naming tool_choice."""
    odd = {"type": "function", "function": {"name": "odd", "parameters": {"type": "nonsense"}}}
    raw = oai.chat.completions.with_raw_response.create(
        model="tiny", messages=MSG, max_tokens=4, tools=[odd], tool_choice="required"
    )
    warning = raw.headers["warning"]
    assert "tool_choice could not be enforced" in warning and "system prompt" in warning
    assert raw.parse().choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_tool_choice_none_renders_no_tools(oai):
    with_tools = chat(oai, tools=[WEATHER], max_tokens=1).usage.prompt_tokens
    without = chat(oai, max_tokens=1).usage.prompt_tokens
    assert (
        chat(oai, tools=[WEATHER], tool_choice="none", max_tokens=1).usage.prompt_tokens
        == without
        < with_tools
    )
    r = chat(oai, tools=[WEATHER], tool_choice="none", extra_body={"guided_regex": PARIS_CALL})
    assert r.choices[0].message.tool_calls is None  # no tools offered: the text is just text
    assert r.choices[0].message.content.startswith("<tool_call>")


def test_tool_round_trip_with_history(oai):
    history = MSG + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]
    r = chat(oai, messages=history, tools=[WEATHER], extra_body={"guided_regex": "Clear skies"})
    assert r.choices[0].message.content == "Clear skies"
    assert r.choices[0].finish_reason == "stop"
    # The JSON-string arguments were rendered as an object, not quoted again: the prompt is
    # exactly as long as with the arguments given as an object.
    as_object = [dict(m) for m in history]
    as_object[1] = {
        **history[1],
        "tool_calls": [
            {
                **history[1]["tool_calls"][0],
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    r2 = chat(oai, messages=as_object, tools=[WEATHER], max_tokens=1)
    assert (
        r2.usage.prompt_tokens
        == chat(oai, messages=history, tools=[WEATHER], max_tokens=1).usage.prompt_tokens
    )


def test_reasoning_goes_to_reasoning_content(oai):
    forced = {"guided_regex": "<think>[a-z]{3,8} [a-z]{3,8}</think>The answer"}
    r = chat(oai, extra_body=forced)
    msg = r.choices[0].message
    assert re.fullmatch("[a-z]{3,8} [a-z]{3,8}", msg.reasoning_content)
    assert msg.content == "The answer"
    chunks = list(chat(oai, extra_body=forced, stream=True))
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert re.fullmatch("[a-z]{3,8} [a-z]{3,8}", reasoning) and content == "The answer"
    assert "<think>" not in content


def test_logprobs_still_work_with_a_constraint(oai):
    r = chat(oai, logprobs=True, top_logprobs=2, extra_body={"guided_choice": ["abc"]})
    tokens = [t.token for t in r.choices[0].logprobs.content]
    assert "".join(tokens).startswith("abc")  # then the end-of-sequence token
    assert all(len(t.top_logprobs) == 2 for t in r.choices[0].logprobs.content)
