"""Values a model writes are always writable: big integers, NaN, lone surrogates (issue 31)."""

from __future__ import annotations

import json

import orjson
import pytest

from mlxd.shared.wire.safe_json import dumps, loads_exact


def test_an_integer_beyond_64_bits_keeps_its_digits():
    out = dumps({"a": 99999999999999999999, "b": [-(10**30)], "c": 2**64 - 1})
    assert json.loads(out) == {"a": 99999999999999999999, "b": [-(10**30)], "c": 2**64 - 1}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_null(value):
    assert orjson.loads(dumps({"x": value, "big": 10**20})) == {"x": None, "big": 1e20}


def test_a_lone_surrogate_becomes_one_replacement_character_in_keys_and_values():
    out = dumps({"k\ud800": ["a\udc00b", "😀"], "n": 10**20})
    assert orjson.loads(out) == {"k\ufffd": ["a\ufffdb", "😀"], "n": 1e20}


def test_what_orjson_writes_is_written_by_orjson_unchanged():
    value = {"a": [1, 2.5, "x", None, True], "b": {"c": -(2**63)}}
    assert dumps(value) == orjson.dumps(value)


def test_model_json_is_read_with_exact_integers():
    assert loads_exact('{"a": 99999999999999999999}') == {"a": 99999999999999999999}


def test_values_nested_past_what_orjson_writes_never_raise():
    from mlxd.shared.wire.safe_json import MAX_DEPTH, dumps, writable

    deep: list = [1]
    for _ in range(300):
        deep = [deep]
    assert dumps(deep) == b"null" and not writable(deep)
    shallow: list = [1]
    for _ in range(MAX_DEPTH - 1):
        shallow = [shallow]
    assert writable(shallow) and dumps(shallow).startswith(b"[[")
