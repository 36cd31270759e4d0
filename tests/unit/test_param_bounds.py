"""Model-independent parameter bounds of the wire models, and who a failed step blames."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from mlxd.shared.errors import BadRequest
from mlxd.shared.params import MAX_SEED, MAX_STOP_CHARS
from mlxd.shared.wire.anthropic import MessagesRequest
from mlxd.shared.wire.bodies import parse_model
from mlxd.shared.wire.completions import CompletionRequest
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.worker.engine.recovery import blame, generation_failed

MSG = [{"role": "user", "content": "hi"}]


def _chat(**fields):
    return parse_model(ChatCompletionRequest, {"messages": MSG, **fields})


@pytest.mark.parametrize("seed", [-1, -(2**63), MAX_SEED + 1, 2**70])
def test_a_seed_the_sampler_cannot_take_is_a_400_naming_seed(seed):
    with pytest.raises(BadRequest) as e:
        _chat(seed=seed)
    assert e.value.param == "seed"
    with pytest.raises(BadRequest):
        parse_model(CompletionRequest, {"prompt": "x", "seed": seed})


@pytest.mark.parametrize("seed", [0, 42, 2**63, MAX_SEED])
def test_every_unsigned_64_bit_seed_is_accepted(seed):
    assert _chat(seed=seed).to_generation_params().seed == seed


@pytest.mark.parametrize("key", ["-5", "²", "1e3", "0x10", "1" * 30, " 7"])
def test_a_logit_bias_key_that_is_not_a_token_id_is_a_400(key):
    with pytest.raises(BadRequest) as e:
        _chat(logit_bias={key: 1.0})
    assert e.value.param == "logit_bias"


def test_logit_bias_values_are_bounded():
    with pytest.raises(BadRequest):
        _chat(logit_bias={"5": 101.0})
    assert _chat(logit_bias={"5": -100.0}).to_generation_params().logit_bias == {5: -100.0}


def test_stop_strings_are_bounded_in_length_on_both_surfaces():
    ok = "x" * MAX_STOP_CHARS
    assert _chat(stop=[ok]).to_generation_params().stop == (ok,)
    with pytest.raises(BadRequest) as e:
        _chat(stop=ok + "x")
    assert e.value.param == "stop"
    with pytest.raises(BadRequest) as e:
        parse_model(
            MessagesRequest, {"messages": MSG, "max_tokens": 5, "stop_sequences": [ok + "x"]}
        )
    assert e.value.param == "stop_sequences"


# -- who a failed engine step blames -----------------------------------------------------
@dataclass(eq=False)
class _Sub:
    rid: str
    processors: list = field(default_factory=list)


@dataclass(eq=False)
class _Row:
    sub: _Sub
    generated: int = 0
    resumed: bool = False
    sent_ahead: bool = False


def _rids(rows):
    return sorted(r.sub.rid for r in rows)


def test_a_row_a_guard_caught_is_the_only_one_failed():
    a, b, c = _Row(_Sub("a"), 5), _Row(_Sub("b"), 0), _Row(_Sub("c"), 3)
    fail, resume = blame([a, b, c], [(a.sub, RuntimeError("x"))])
    assert _rids(fail) == ["a"] and _rids(resume) == ["b", "c"]


def test_without_a_caught_row_the_rows_without_tokens_are_blamed():
    old, new = _Row(_Sub("old"), 12), _Row(_Sub("new"), 0)
    fail, resume = blame([old, new], [])
    assert _rids(fail) == ["new"] and _rids(resume) == ["old"]


def test_a_row_whose_only_token_went_out_ahead_is_blamed_as_a_newcomer():
    """Its first token was sent at the end of the step that drew it (emit.send_first): the
    failed step was its first decode step, where its parameters meet sampling first."""
    old, new = _Row(_Sub("old"), 1), _Row(_Sub("new"), 1, sent_ahead=True)
    fail, resume = blame([old, new], [])
    assert _rids(fail) == ["new"] and _rids(resume) == ["old"]


def test_when_every_row_is_decoding_all_fail():
    rows = [_Row(_Sub("a"), 2), _Row(_Sub("b"), 9)]
    fail, resume = blame(rows, [])
    assert _rids(fail) == ["a", "b"] and resume == []


def test_a_row_with_a_grammar_is_not_resumed():
    grammar, plain, new = _Row(_Sub("g", [object()]), 4), _Row(_Sub("p"), 4), _Row(_Sub("n"))
    fail, resume = blame([grammar, plain, new], [])
    assert _rids(fail) == ["g", "n"] and _rids(resume) == ["p"]


def test_the_client_message_names_the_request_but_no_exception_text():
    err = generation_failed("chatcmpl-abc")
    assert err.status == 503 and "chatcmpl-abc" in err.message and "worker log" in err.message


def test_a_row_already_resumed_once_is_not_carried_again():
    again, first = _Row(_Sub("again"), 9, resumed=True), _Row(_Sub("first"), 3)
    fail, resume = blame([again, first, _Row(_Sub("n"))], [])
    assert _rids(fail) == ["again", "n"] and _rids(resume) == ["first"]
