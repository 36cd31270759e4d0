"""guided_grammar: regular grammars become one regex; anything else is refused clearly."""

from __future__ import annotations

import re

import pytest

from mlxd.worker.grammar.regex import GrammarError, GrammarTooLong, grammar_to_regex

CASES = [
    ('root ::= answer "."\nanswer ::= "yes" | "no"  # a comment', ["yes.", "no."], ["maybe."]),
    (
        'start: greeting " " name\ngreeting: "hi"\n    | "hello"\nname: /[A-Z][a-z]+/',
        ["hi Bob", "hello Ann"],
        ["hey Bob", "hi bob"],
    ),
    ('root ::= [0-9]{1,3} ("," [0-9]{1,3})*', ["1", "12,345,6"], ["1234", "1,"]),
    ("root ::= 'a+b' item?\nitem ::= \"\\n\"", ["a+b", "a+b\n"], ["aab"]),
]


@pytest.mark.parametrize("grammar,good,bad", CASES)
def test_regular_grammar_matches_what_it_should(grammar, good, bad):
    rx = re.compile(grammar_to_regex(grammar))
    assert all(rx.fullmatch(s) for s in good)
    assert not any(rx.fullmatch(s) for s in bad)


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= "(" root ")" | "x"',
        'root ::= a\na ::= "x" b\nb ::= a',
        "%import common.WORD\nstart: WORD",
        "root ::= undefined_rule",
        'root ::= "unterminated',
    ],
)
def test_what_is_not_a_regular_grammar_is_refused(grammar):
    with pytest.raises(GrammarError):
        grammar_to_regex(grammar)


def test_a_grammar_that_doubles_at_every_rule_is_stopped_while_it_is_built():
    # 40 rules that each use the next twice name a regex of 2^40 characters.
    rules = [f"r{i} ::= r{i + 1} r{i + 1}" for i in range(40)] + ['r40 ::= "ab"']
    with pytest.raises(GrammarTooLong, match="more than 65536 bytes"):
        grammar_to_regex("\n".join(rules), max_bytes=65536)
    # The same grammar, shallow enough, still turns into its regex.
    small = [f"r{i} ::= r{i + 1} r{i + 1}" for i in range(3)] + ['r3 ::= "ab"']
    assert re.fullmatch(grammar_to_regex("\n".join(small), max_bytes=65536), "ab" * 8)
