"""The grammar compile child: `python -m mlxd.worker.grammar.compile_child MEMORY_BYTES CPU_S`.

Compiling a constraint into an outlines-core Index can take gigabytes and minutes, so it runs
here, in a fresh interpreter (spawned, never forked: the worker has touched MLX) under an
address-space and a CPU-time limit, and is killed by the worker at its deadline or when the
client leaves. One child compiles one constraint and exits, so whatever the compile allocated
goes back to the system with it.

Protocol, frames of an 8-byte big-endian length and a payload: the worker sends the pickled
Vocabulary, then one JSON job {kind, value, param, limits}; the child answers one JSON header
{ok, reason, message, regex_bytes} and, when ok, a frame holding the pickled Index.
This module imports nothing that touches MLX.
"""

from __future__ import annotations

import pickle
import resource
import struct
import sys
from typing import Any, BinaryIO

import orjson

from mlxd.worker.grammar.limits import GrammarLimits, GrammarTooLarge, check_regex
from mlxd.worker.grammar.regex import GrammarError, GrammarTooLong, grammar_to_regex

# Any JSON object; nesting is bounded because the automaton is finite.
JSON_OBJECT_SCHEMA = {"type": "object"}
# Each frame: its length, then its bytes. Defined here, not in child_io.py, so that this fresh
# interpreter imports neither asyncio nor psutil (the worker's side of the wire needs both).
FRAME = struct.Struct(">Q")


def frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload)) + payload


def write_frame(out: BinaryIO, payload: bytes) -> None:
    out.write(frame(payload))


def read_frame(inp: BinaryIO) -> bytes | None:
    head = inp.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (n,) = FRAME.unpack(head)
    payload = inp.read(n)
    return payload if len(payload) == n else None


def escape_regex(text: str) -> str:
    """`text` as a literal in the regex dialect (Rust's regex crate)."""
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$#&-~" else c for c in text)


def spec_regex(kind: str, value: Any, max_bytes: int = 1 << 62) -> str:
    """The regular expression a constraint asks the output to match (ValueError if none)."""
    if kind == "regex":
        return value
    if kind == "choice":
        return "(" + "|".join(escape_regex(str(c)) for c in value) + ")"
    if kind == "grammar":
        return grammar_to_regex(value, max_bytes)
    if kind == "tool_call":
        return tool_call_regex(value)
    schema = JSON_OBJECT_SCHEMA if kind == "json_object" else value
    return _schema_regex(schema)


def _schema_regex(schema: Any) -> str:
    from outlines_core.json_schema import build_regex_from_schema

    return build_regex_from_schema(orjson.dumps(schema).decode())


def tool_call_regex(value: dict) -> str:
    """A forced tool call in the JSON-in-tags format (worker/chat/tool_calls.py
    `forced_call_spec`): `start`, one of `tools` as {"name": …, "arguments": …}, `end`."""
    calls = "|".join(
        '\\{"name": '
        + escape_regex(orjson.dumps(t["name"]).decode())
        + ', "arguments": '
        + _schema_regex(t.get("parameters") or {"type": "object"})
        + "\\}"
        for t in value["tools"]
    )
    return f"{escape_regex(value['start'])}\n({calls})\n{escape_regex(value['end'])}"


def compile_job(vocabulary, job: dict) -> tuple[dict, bytes | None]:
    """Build the job's Index: (header, pickled Index or None)."""
    from outlines_core import Index

    limits = GrammarLimits(**job["limits"])
    kind, param = job["kind"], job["param"]
    try:
        # A schema or grammar may expand to far more than the client wrote (optional
        # properties grow quadratically): the built regex is bounded again.
        regex = spec_regex(kind, job["value"], limits.max_bytes * 16)
        if kind != "regex":
            check_regex(regex, param, limits, " (as a regular expression)")
        index = Index(regex, vocabulary)
    except GrammarTooLarge as exc:
        return {"ok": False, "reason": "too_large", "message": str(exc)}, None
    except GrammarTooLong as exc:
        return {
            "ok": False,
            "reason": "too_large",
            "message": f"'{param}' {exc} (16 × grammar_max_bytes)",
        }, None
    except (GrammarError, ValueError, TypeError, RuntimeError) as exc:
        return {"ok": False, "reason": "invalid", "message": str(exc)[:1000]}, None
    except MemoryError:
        return {"ok": False, "reason": "memory", "message": "out of memory"}, None
    blob = pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
    return {"ok": True, "regex_bytes": len(regex)}, blob


def _limit(memory_bytes: int, cpu_s: int) -> None:
    # The address-space cap counts from what the interpreter already maps. macOS does not
    # enforce RLIMIT_AS; there the worker's RSS watch is the memory bound.
    try:
        with open("/proc/self/statm") as f:
            base = int(f.read().split()[0]) * resource.getpagesize()
    except OSError:
        base = 0
    for which, value in ((resource.RLIMIT_AS, base + memory_bytes), (resource.RLIMIT_CPU, cpu_s)):
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass


def main(argv: list[str]) -> int:
    from mlxd.shared.lifeline import die_with_parent

    die_with_parent()
    import outlines_core.json_schema  # noqa: F401  (imported while a spare child waits)

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    vocab_blob = read_frame(inp)
    vocabulary = pickle.loads(vocab_blob) if vocab_blob is not None else None
    job_blob = read_frame(inp)  # a spare child waits here until it is given a job
    if vocabulary is None or job_blob is None:
        return 0  # the worker went away or gave the spare back
    _limit(int(argv[0]), int(argv[1]))
    header, blob = compile_job(vocabulary, orjson.loads(job_blob))
    write_frame(out, orjson.dumps(header))
    if blob is not None:
        write_frame(out, blob)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
