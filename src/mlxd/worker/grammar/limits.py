"""Static bounds on a structured-output request, checked before anything is compiled.

Compiling a regex against a vocabulary costs roughly (automaton states × vocabulary size), and
a counted repetition `x{m,n}` makes `max(m, n)` copies of `x`'s states. So what is bounded is
every repetition count (regex `{m,n}`, schema minLength/maxItems/…), the client's text in bytes,
and the regex's size with counted repetitions expanded ("positions"). Over a bound is the
client's 400, naming the field and the cap; this module imports no MLX and runs in the worker
and in the compile child alike.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from mlxd.shared.errors import BadRequest

# JSON-schema keywords that turn into a repetition count in the compiled regex.
COUNT_KEYWORDS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
    "minDigits",
    "maxDigits",
)
# Where each surface's schema sits inside its field, for error messages a client can follow.
SCHEMA_PATHS = {
    "response_format": "response_format.json_schema.schema",
    "text.format": "text.format.schema",
    "output_format": "output_format.schema",
    "output_config.format": "output_config.format.schema",
}
MAX_NESTING = 200  # the regex engine refuses deeper groups anyway; this keeps our parser safe
# The dialect allows spaces in a count (`a{ 2 , 3 }`, and between digits in `(?x)` mode);
# `{,n}` is read as a count too, to be safe. Over-reading a count only ever refuses more.
_COUNT = re.compile(r"\{([\d\s]*)(,([\d\s]*))?\}")


@dataclass(frozen=True)
class GrammarLimits:
    """The caps (settings `grammar_max_repeat`, `grammar_max_bytes`, `grammar_max_positions`)."""

    max_repeat: int = 1000
    max_bytes: int = 64 * 1024
    max_positions: int = 50_000

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class GrammarTooLarge(BadRequest):
    """A structured-output constraint over a static bound: the client's 400."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message, param=param, code="grammar_too_large")


def check_spec(kind: str, value: Any, param: str, limits: GrammarLimits) -> None:
    """Raise GrammarTooLarge if the constraint is over a bound that needs no compiling."""
    if kind == "json_object":
        return
    text = value if isinstance(value, str) else orjson.dumps(value)
    size = len(text.encode() if isinstance(text, str) else text)
    if size > limits.max_bytes:
        raise GrammarTooLarge(
            f"'{param}' is {size} bytes; structured output allows at most "
            f"{limits.max_bytes} (grammar_max_bytes)",
            param,
        )
    if kind == "json_schema":
        check_schema(value, SCHEMA_PATHS.get(param, param), limits)
    elif kind == "tool_call":  # the forced call's tools, each schema as response_format's
        for tool in value["tools"]:
            schema = tool.get("parameters") or {}
            check_schema(schema, f"tools[{tool.get('name')}].parameters", limits)
    elif kind == "regex":
        check_regex(value, param, limits)


def check_schema(schema: Any, where: str, limits: GrammarLimits) -> None:
    """Every count keyword of `schema` (at any depth) within `limits.max_repeat`."""
    stack: list[tuple[Any, str, int]] = [(schema, where, 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_NESTING:
            raise GrammarTooLarge(f"'{where}' nests deeper than {MAX_NESTING} levels", where)
        if isinstance(node, dict):
            for key, sub in node.items():
                if key in COUNT_KEYWORDS and _is_number(sub) and sub > limits.max_repeat:
                    raise GrammarTooLarge(
                        f"'{path}.{key}' is {_show(sub)}; structured output allows counts up "
                        f"to {limits.max_repeat} (grammar_max_repeat)",
                        f"{path}.{key}",
                    )
                stack.append((sub, f"{path}.{key}", depth + 1))
        elif isinstance(node, list):
            stack.extend((sub, f"{path}[{i}]", depth + 1) for i, sub in enumerate(node))


def check_regex(regex: str, param: str, limits: GrammarLimits, what: str = "") -> int:
    """The regex's positions (its size with counted repetitions expanded), if within bounds.

    `what` describes a regex the client did not write (one built from a schema or a grammar).
    """
    try:
        positions = _Cost(regex, limits.max_repeat).total()
    except _RepeatTooLarge as exc:
        raise GrammarTooLarge(
            f"'{param}'{what} repeats {exc.count} times; structured output "
            f"allows counts up to {limits.max_repeat} (grammar_max_repeat)",
            param,
        ) from None
    except _TooDeep:
        raise GrammarTooLarge(
            f"'{param}'{what} nests deeper than {MAX_NESTING} groups", param
        ) from None
    if positions > limits.max_positions:
        raise GrammarTooLarge(
            f"'{param}'{what} expands to {positions} positions once its repetitions are "
            f"counted out; structured output allows {limits.max_positions} "
            "(grammar_max_positions)",
            param,
        )
    return positions


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _show(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e18 else f"{v:g}"


class _RepeatTooLarge(Exception):
    def __init__(self, count: str):
        self.count = count


class _TooDeep(Exception):
    pass


class _Cost:
    """Recursive descent over Rust-regex syntax, counting positions; never validates it."""

    def __init__(self, s: str, max_repeat: int):
        self.s, self.i, self.max_repeat, self.depth = s, 0, max_repeat, 0

    def total(self) -> int:
        cost = self._alternatives()
        while self.i < len(self.s):  # a stray ')': the regex engine will say so; keep counting
            self.i += 1
            cost += self._alternatives()
        return cost

    def _alternatives(self) -> int:
        cost = self._sequence()
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            cost += self._sequence()
        return cost

    def _sequence(self) -> int:
        cost = 0
        while self.i < len(self.s) and self.s[self.i] not in "|)":
            cost += self._quantified(self._atom())
        return cost

    def _atom(self) -> int:
        s, c = self.s, self.s[self.i]
        if c == "(":
            return self._group()
        if c == "[":
            self._skip_class()
            return 1
        if c == "\\":
            nxt = s[self.i + 1 : self.i + 2]
            if nxt in ("p", "P", "x", "u", "U") and s[self.i + 2 : self.i + 3] == "{":
                end = s.find("}", self.i)
                self.i = len(s) if end < 0 else end + 1
            else:
                self.i += {"p": 3, "P": 3, "x": 4, "u": 6, "U": 10}.get(nxt, 2)
            return 1
        self.i += 1
        return 1

    def _group(self) -> int:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _TooDeep
        s = self.s
        self.i += 1
        if s.startswith("?", self.i):  # (?:…) (?P<name>…) (?<name>…) (?flags) (?flags:…)
            j = self.i + 1
            if s.startswith(("P<", "<"), j):
                j = s.find(">", j) + 1 or len(s)
            else:
                while j < len(s) and s[j] not in ":)":
                    j += 1
                if s.startswith(")", j):  # a flag group matches nothing
                    self.i = j + 1
                    self.depth -= 1
                    return 0
                j += 1
            self.i = j
        cost = self._alternatives()
        if self.i < len(s) and s[self.i] == ")":
            self.i += 1
        self.depth -= 1
        return cost

    def _skip_class(self) -> None:
        s, i = self.s, self.i + 1
        if s.startswith("^", i):
            i += 1
        if s.startswith("]", i):  # a leading ']' is a literal
            i += 1
        depth = 1
        while i < len(s) and depth:
            if s[i] == "\\":
                i += 1
            elif s[i] == "[":
                depth += 1
            elif s[i] == "]":
                depth -= 1
            i += 1
        self.i = i

    def _quantified(self, cost: int) -> int:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in "*+?":
                self.i += 1
                continue
            m = _COUNT.match(s, self.i) if c == "{" else None
            if m is None:
                return cost
            lo, hi = ("".join((g or "").split()) for g in (m.group(1), m.group(3)))
            if not (lo or hi):
                return cost
            lo = lo or "0"
            for digits in (lo, hi):
                # More digits than any cap: report it without building a huge int.
                if digits and (len(digits) > 9 or int(digits) > self.max_repeat):
                    raise _RepeatTooLarge(digits if len(digits) <= 12 else digits[:12] + "…")
            copies = int(hi) if hi else int(lo) + (1 if m.group(2) else 0)
            cost *= max(copies, 1)
            self.i = m.end()
        return cost
