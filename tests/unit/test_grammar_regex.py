"""guided_grammar: regular grammars become one regex; anything else is refused clearly."""

from __future__ import annotations

import re

import pytest

from mlxd.worker.grammar_regex import GrammarError, grammar_to_regex

CASES = [
    ('root ::= answer "."\nanswer ::= "yes" | "no"  # a comment', ["yes.", "no."], ["maybe."]),
    ('start: greeting " " name\ngreeting: "hi"\n    | "hello"\nname: /[A-Z][a-z]+/',
     ["hi Bob", "hello Ann"], ["hey Bob", "hi bob"]),
    ('root ::= [0-9]{1,3} ("," [0-9]{1,3})*', ["1", "12,345,6"], ["1234", "1,"]),
    ("root ::= 'a+b' item?\nitem ::= \"\\n\"", ["a+b", "a+b\n"], ["aab"]),
]


@pytest.mark.parametrize("grammar,good,bad", CASES)
def test_regular_grammar_matches_what_it_should(grammar, good, bad):
    rx = re.compile(grammar_to_regex(grammar))
    assert all(rx.fullmatch(s) for s in good)
    assert not any(rx.fullmatch(s) for s in bad)


@pytest.mark.parametrize("grammar", [
    'root ::= "(" root ")" | "x"',
    'root ::= a\na ::= "x" b\nb ::= a',
    "%import common.WORD\nstart: WORD",
    'root ::= undefined_rule',
    'root ::= "unterminated',
])
def test_what_is_not_a_regular_grammar_is_refused(grammar):
    with pytest.raises(GrammarError):
        grammar_to_regex(grammar)
