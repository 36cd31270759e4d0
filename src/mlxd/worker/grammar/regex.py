"""`guided_grammar` to a regular expression, for grammars that are regular.

outlines-core enforces regular languages, so a grammar is accepted when no rule refers back to
itself (directly or not): its rules are then inlined into one regex. Both common notations
parse: GBNF (`root ::= "yes" | "no"`) and Lark/EBNF (`start: "yes" | "no"`), with literals in
single or double quotes, character classes, `.`, Lark `/regex/` terminals, grouping and the
quantifiers `* + ?` and `{m,n}`. Anything else raises GrammarError (a recursive grammar,
directives such as `%import`), which the caller turns into a prompt instruction.
Inlining copies a rule at every use, so a small grammar can name an exponentially long regex:
the regex being built is bounded by `max_bytes` (GrammarTooLong, the client's 400).
"""

from __future__ import annotations

import re

_RULE_HEAD = re.compile(r"^\s*\??([A-Za-z_][\w\-.]*)\s*(::=|:)(?!:)(.*)$")
_META = set(r"\.+*?()|[]{}^$#&-~")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


class GrammarError(ValueError):
    """The grammar cannot be turned into a regular expression."""


class GrammarTooLong(GrammarError):
    """The grammar's regex would be longer than allowed (a bound, not a degrade)."""


def grammar_to_regex(text: str, max_bytes: int = 1 << 62) -> str:
    """The one regex equivalent to the regular grammar `text`, at most `max_bytes` long."""
    rules = _split_rules(text)
    if not rules:
        raise GrammarError("the grammar defines no rules")
    start = next((n for n in ("root", "start") if n in rules), next(iter(rules)))
    return _Inliner(rules, max_bytes).expand(start, ())


def _split_rules(text: str) -> dict[str, str]:
    rules: dict[str, str] = {}
    current = None
    for raw in text.splitlines():
        line = _strip_comment(raw)
        if not line.strip():
            continue
        if line.lstrip().startswith("%"):
            raise GrammarError(f"directives are not supported: {line.strip()}")
        head = _RULE_HEAD.match(line)
        if head and not line[: head.start(2)].strip().startswith(("|", '"', "'")):
            current = head.group(1)
            if current in rules:
                raise GrammarError(f"rule {current!r} is defined twice")
            rules[current] = head.group(3)
        elif current is None:
            raise GrammarError(f"text outside a rule: {line.strip()}")
        else:
            rules[current] += " " + line.strip()
    return rules


def _strip_comment(line: str) -> str:
    out, quote, i = [], None, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                out.append(line[i : i + 2])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'[/" and not (c == "/" and line[i : i + 2] == "//"):
            quote = {"[": "]"}.get(c, c)
        elif c == "#" or line[i : i + 2] == "//":
            break
        out.append(c)
        i += 1
    return "".join(out)


class _Inliner:
    def __init__(self, rules: dict[str, str], max_bytes: int):
        self.rules = rules
        self.max_bytes = max_bytes
        self.done: dict[str, str] = {}

    def expand(self, name: str, stack: tuple[str, ...]) -> str:
        if name in stack:
            raise GrammarError(f"rule {name!r} is recursive; only regular grammars are supported")
        if name not in self.done:
            if name not in self.rules:
                raise GrammarError(f"rule {name!r} is not defined")
            parser = _Parser(
                self.rules[name], lambda ref: self.expand(ref, stack + (name,)), self.max_bytes
            )
            self.done[name] = parser.parse()
        return self.done[name]


class _Parser:
    """Recursive descent over one rule body; rule references are expanded through `ref`."""

    def __init__(self, body: str, ref, max_bytes: int):
        self.s = body
        self.i = 0
        self.ref = ref
        self.max_bytes = max_bytes

    def parse(self) -> str:
        out = self.alternatives()
        self._space()
        if self.i < len(self.s):
            raise GrammarError(f"unexpected {self.s[self.i : self.i + 10]!r}")
        return out

    def alternatives(self) -> str:
        alts = [self.sequence()]
        size = len(alts[0])
        while self._peek() == "|":
            self.i += 1
            alts.append(self.sequence())
            size = self._bounded(size + len(alts[-1]))
        return alts[0] if len(alts) == 1 else "(" + "|".join(alts) + ")"

    def sequence(self) -> str:
        items, size = [], 0
        while self._peek() not in ("", "|", ")"):
            items.append(self.quantified())
            size = self._bounded(size + len(items[-1]))
        return "".join(items)

    def _bounded(self, size: int) -> int:
        # Checked as the pieces are made, so the over-long regex is never built.
        if size > self.max_bytes:
            raise GrammarTooLong(
                f"expands to a regex of more than {self.max_bytes} bytes once its rules are inlined"
            )
        return size

    def quantified(self) -> str:
        atom = self.atom()
        while True:
            c = self._peek()
            if c in ("*", "+", "?"):
                self.i += 1
                atom = f"({atom}){c}"
            elif c == "{":
                end = self.s.index("}", self.i)
                bounds = self.s[self.i : end + 1].replace(" ", "")
                if not re.fullmatch(r"\{\d*(,\d*)?\}", bounds):
                    raise GrammarError(f"bad repetition {bounds}")
                self.i = end + 1
                atom = f"({atom}){bounds}"
            else:
                return atom

    def atom(self) -> str:
        c = self._peek()
        if c == "(":
            self.i += 1
            inner = self.alternatives()
            if self._peek() != ")":
                raise GrammarError("unbalanced parentheses")
            self.i += 1
            return f"({inner})"
        if c in ("'", '"'):
            return "".join("\\" + ch if ch in _META else ch for ch in self._literal(c))
        if c == "[":
            end = self._closing("]")
            return self._take(end)
        if c == "/":
            end = self._closing("/")
            return "(" + self._take(end)[1:-1] + ")"
        if c == ".":
            self.i += 1
            return "."
        m = re.compile(r"[A-Za-z_][\w\-.]*").match(self.s, self.i)
        if not m:
            raise GrammarError(f"unexpected {self.s[self.i : self.i + 10]!r}")
        self.i = m.end()
        return "(" + self.ref(m.group(0)) + ")"

    def _literal(self, quote: str) -> str:
        self.i += 1
        out = []
        while self.i < len(self.s) and self.s[self.i] != quote:
            if self.s[self.i] == "\\" and self.i + 1 < len(self.s):
                out.append(_ESCAPES.get(self.s[self.i + 1], self.s[self.i + 1]))
                self.i += 2
            else:
                out.append(self.s[self.i])
                self.i += 1
        if self.i >= len(self.s):
            raise GrammarError("unterminated string literal")
        self.i += 1
        return "".join(out)

    def _closing(self, close: str) -> int:
        j = self.i + 1
        while j < len(self.s) and self.s[j] != close:
            j += 2 if self.s[j] == "\\" else 1
        if j >= len(self.s):
            raise GrammarError(f"missing {close!r}")
        return j

    def _take(self, end: int) -> str:
        text = self.s[self.i : end + 1]
        self.i = end + 1
        return text

    def _peek(self) -> str:
        self._space()
        return self.s[self.i] if self.i < len(self.s) else ""

    def _space(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1
