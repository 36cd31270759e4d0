"""A template that opens <think> in the generation prompt (DeepSeek-R1 / QwQ style).

The output then starts inside reasoning, with no marker of its own. The worker runs with
--no-enable-thinking, so reasoning happens only when a request turns it on.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from procs import start_worker, stop, uds_openai
from tiny_model import CHAT_TEMPLATE, build_tiny_model
from tiny_model import OPEN_THINK_TEMPLATE as OPEN_THINK

MSG = [{"role": "user", "content": "Where is the Eiffel tower?"}]
THINK_ON = {"chat_template_kwargs": {"enable_thinking": True}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    assert OPEN_THINK != CHAT_TEMPLATE
    return build_tiny_model(tmp_path_factory.mktemp("open-think"), chat_template=OPEN_THINK)


@pytest.fixture(scope="module")
def oai(model_dir, short_tmp):
    sock = short_tmp / "think.sock"
    proc = start_worker(
        model_dir,
        sock,
        "tiny",
        "--no-enable-thinking",
        "--no-ssd-cache",
        log=short_tmp / "think.log",
    )
    yield uds_openai(sock)
    stop(proc)


def ask(oai, **kw):
    return oai.chat.completions.create(model="tiny", messages=MSG, temperature=0, **kw)


def test_worker_default_off_gives_plain_content(oai):
    msg = ask(oai, max_tokens=6).choices[0].message
    assert msg.content and msg.reasoning_content is None


def test_open_think_block_puts_the_output_in_reasoning(oai):
    r = ask(oai, max_tokens=6, extra_body=THINK_ON)
    assert r.choices[0].message.reasoning_content
    assert not r.choices[0].message.content
    chunks = list(ask(oai, max_tokens=6, extra_body=THINK_ON, stream=True))
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    assert reasoning == r.choices[0].message.reasoning_content
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)


def test_constraint_waits_for_the_reasoning_to_end(oai, model_dir):
    # logit_bias makes the model close its think block at once; the regex then governs the
    # answer only (applied from the first token, "</think>" could never be produced).
    end = Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id("</think>")
    r = ask(
        oai,
        max_tokens=40,
        logit_bias={str(end): 100},
        extra_body={**THINK_ON, "guided_regex": "Paris, France"},
    )
    msg = r.choices[0].message
    assert msg.content == "Paris, France" and not msg.reasoning_content
    assert r.choices[0].finish_reason == "stop"
