"""A tool call the model writes with an integer beyond 64 bits is answered on every surface,
streamed or not, through the real daemon and the official clients (issue 31: it was a 500, or
a stream that went silent forever)."""

from __future__ import annotations

import json

import anthropic
import ollama
from test_ollama_api import ExtraBody

ADD_PARAMS = {"type": "object", "properties": {"a": {"type": "integer"}}}
BIG = 99999999999999999999
BIG_CALL = (
    '<tool_call>\\n\\{"name": "add", "arguments": \\{"a": ' + str(BIG) + "\\}\\}\\n</tool_call>"
)
FORCED = {"guided_regex": BIG_CALL}
# Greedy, with room: sampled at the tiny model's default temperature, the regex can be spelled
# in single characters, past 64 tokens (a stop on max_tokens instead of the call).
GREEDY = {"temperature": 0, "max_tokens": 256}
MSG = [{"role": "user", "content": "Add."}]


def test_a_big_integer_in_a_tool_call_reaches_every_client_with_its_digits(make_daemon):
    d = make_daemon()
    oai = d.openai()
    chat_tools = [{"type": "function", "function": {"name": "add", "parameters": ADD_PARAMS}}]

    whole = oai.chat.completions.create(
        model="a", messages=MSG, tools=chat_tools, extra_body=FORCED, **GREEDY
    )
    assert json.loads(whole.choices[0].message.tool_calls[0].function.arguments) == {"a": BIG}
    chunks = list(
        oai.chat.completions.create(
            model="a", messages=MSG, tools=chat_tools, stream=True, extra_body=FORCED, **GREEDY
        )
    )
    deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert json.loads("".join(t.function.arguments for t in deltas)) == {"a": BIG}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    claude = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0, timeout=60)
    tools = [{"name": "add", "input_schema": ADD_PARAMS}]
    # This SDK's create() has no temperature any more: it goes in the body.
    greedy = {"max_tokens": 256, "extra_body": {**FORCED, "temperature": 0}}
    msg = claude.messages.create(model="a", messages=MSG, tools=tools, **greedy)
    assert [b.input for b in msg.content if b.type == "tool_use"] == [{"a": BIG}]
    with claude.messages.stream(model="a", messages=MSG, tools=tools, **greedy) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.input for b in final.content if b.type == "tool_use"] == [{"a": BIG}]

    fn = [{"type": "function", "name": "add", "parameters": ADD_PARAMS}]
    ropts = {"temperature": 0, "max_output_tokens": 256, "extra_body": FORCED}
    resp = oai.responses.create(model="a", input="Add.", tools=fn, **ropts)
    call = next(i for i in resp.output if i.type == "function_call")
    assert json.loads(call.arguments) == {"a": BIG}
    events = list(oai.responses.create(model="a", input="Add.", tools=fn, stream=True, **ropts))
    assert events[-1].type == "response.completed"
    args = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(a) for a in args] == [{"a": BIG}]
    stored = oai.responses.retrieve(events[-1].response.id)  # the store kept the turn
    assert [i.type for i in stored.output] == ["function_call"]

    olla = ollama.Client(host=d.url, timeout=120, transport=ExtraBody(**FORCED))
    opts = {"temperature": 0, "num_predict": 256}
    answer = olla.chat(model="a", messages=MSG, tools=chat_tools, options=opts)
    assert answer.message.tool_calls[0].function.arguments == {"a": BIG}
    parts = list(olla.chat(model="a", messages=MSG, tools=chat_tools, stream=True, options=opts))
    assert parts[-1].done
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert calls[0].function.arguments == {"a": BIG}
    assert "Traceback" not in d.logs()
