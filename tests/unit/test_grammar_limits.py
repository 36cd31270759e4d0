"""Static grammar bounds: what is refused before any compile, with a 400 naming the field."""

from __future__ import annotations

import pytest

from mlxd.shared.byte_lru import ByteLRU
from mlxd.worker.grammar.limits import GrammarLimits, GrammarTooLarge, check_regex, check_spec

LIMITS = GrammarLimits(max_repeat=1000, max_bytes=4096, max_positions=5000)


@pytest.mark.parametrize(
    "regex",
    [
        ".{1,65535}",
        "a{1001}",
        "(ab){2000,}",
        "x{0,99999999999999999999}",
        "[a-z]{3}{5000}",
        "a{ 2 , 5000 }",
        "a{,5000}",
        "(?x)a{5 0 0 0}",  # the dialect reads these as counts
    ],
)
def test_a_repetition_over_the_cap_is_refused(regex):
    with pytest.raises(GrammarTooLarge) as exc:
        check_regex(regex, "guided_regex", LIMITS)
    assert exc.value.status == 400 and exc.value.param == "guided_regex"
    assert "grammar_max_repeat" in exc.value.message and "1000" in exc.value.message


@pytest.mark.parametrize(
    "regex",
    [
        "(a{100}){100}",  # nested counts multiply: 10 000 positions
        "((x{20}){20}){20}",
        "(" * 10 + "a{999}" + ")" * 10 + "{9}",
    ],
)
def test_nested_repetitions_multiply(regex):
    with pytest.raises(GrammarTooLarge, match="grammar_max_positions"):
        check_regex(regex, "guided_regex", LIMITS)


@pytest.mark.parametrize(
    "regex,positions",
    [
        ("[A-Z][a-z]{2,6} [0-9]{2}", 1 + 6 + 1 + 2),
        (r"\{\d{3}\}", 1 + 3 + 1),  # escaped braces are literals, not counts
        (r"\p{L}{4}|x", 4 + 1),  # a class name in braces is no count either
        ("(?i)(?:ab){3}(?P<n>c)", 6 + 1),
        ("[{]{1,2}[]a]", 2 + 1),
        ("a{2}{3}", 6),
    ],
)
def test_ordinary_patterns_pass_and_are_counted(regex, positions):
    assert check_regex(regex, "guided_regex", LIMITS) == positions


def test_deep_nesting_is_refused_without_a_recursion_error():
    with pytest.raises(GrammarTooLarge, match="nests deeper"):
        check_regex("(" * 5000 + "a" + ")" * 5000, "guided_regex", LIMITS)


def test_schema_counts_are_named_by_their_path():
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "minLength": 1e9}}},
    }
    with pytest.raises(GrammarTooLarge) as exc:
        check_spec("json_schema", schema, "response_format", LIMITS)
    where = "response_format.json_schema.schema.properties.tags.items.minLength"
    assert exc.value.param == where
    assert "1000000000" in exc.value.message and where in exc.value.message


@pytest.mark.parametrize("keyword", ["maxLength", "minItems", "maxItems", "maxProperties"])
def test_every_count_keyword_is_capped(keyword):
    with pytest.raises(GrammarTooLarge, match=keyword):
        check_spec("json_schema", {"anyOf": [{keyword: 5000}]}, "guided_json", LIMITS)


def test_counts_within_the_cap_and_other_numbers_pass():
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 1000},
            "age": {"type": "integer", "maximum": 10**12},  # a value bound, not a repetition
            "minLength": {"type": "boolean"},
        },
    }  # a property that happens to be called minLength
    check_spec("json_schema", schema, "guided_json", LIMITS)


def test_text_over_the_byte_cap_is_refused():
    with pytest.raises(GrammarTooLarge, match="grammar_max_bytes"):
        check_spec("regex", "a" * 5000, "guided_regex", LIMITS)
    with pytest.raises(GrammarTooLarge, match="grammar_max_bytes"):
        check_spec("choice", ["x" * 100] * 100, "guided_choice", LIMITS)
    check_spec("json_object", None, "response_format", LIMITS)


def test_the_compiled_grammar_cache_is_capped_by_bytes_and_lru():
    cache = ByteLRU(100)
    assert cache.put("a", 1, 40) and cache.put("b", 2, 40)
    assert cache.get("a") == 1  # "b" is now the least recently used
    assert cache.put("c", 3, 40)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.bytes == 80
    assert not cache.put("huge", 4, 101)  # larger than the whole cap: not kept
    assert cache.bytes == 80 and len(cache) == 2
