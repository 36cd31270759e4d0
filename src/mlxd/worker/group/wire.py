"""What rank 0 tells its followers each engine iteration, as bytes (no MLX here).

An iteration's events are the inbox commands every rank must apply at the same step: a new
row (its tokenized prompt, resolved parameters, cache namespace and session), a cancellation,
a closed session, a drain's persist and "admit nothing more", the stop. Rows are named by a sequence
number rank 0 assigns, since request ids come from clients and need not be unique. The first
message of a group is the hello: what rank 0 decided for all (the random seed, the prefill
plan, the KV budget, the RAM prompt-cache cap).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import orjson

from mlxd.shared.params import GenerationParams

SUBMIT, CANCEL, STOP, CLOSE = "submit", "cancel", "stop", "close"
FORGET = "forget"  # a session's prompt-cache entries go, on every rank
PERSIST = "persist"  # every rank queues its RAM entries for its SSD tier (a drain)


@dataclass(frozen=True)
class RowEvent:
    """One event of an iteration; `seq` names the row (0 for stop and close)."""

    kind: str
    seq: int = 0
    rid: str = ""
    prompt: tuple[int, ...] = ()
    params: GenerationParams | None = None
    ns: str = ""
    boundary: int = 0
    session: str | None = None  # the row's (SUBMIT) or the one to forget (FORGET)
    restore: tuple[int, ...] = ()  # SUBMIT: the tokens of the SSD entry rank 0 read for it


@dataclass(frozen=True)
class Hello:
    """Rank 0's decisions that make every rank's engine the same one."""

    seed: int
    idle_chunk: int
    step_budget: int
    min_chunk: int
    kv_budget_bytes: int | None
    cache_ram_bytes: int  # the RAM prompt-cache cap (0: none); entries are equal on every rank


def params_to_json(p: GenerationParams) -> dict[str, Any]:
    d = dataclasses.asdict(p)
    d["logit_bias"] = [[int(k), float(v)] for k, v in p.logit_bias.items()]
    return d


def params_from_json(d: dict[str, Any]) -> GenerationParams:
    d = dict(d)
    d["logit_bias"] = {int(k): float(v) for k, v in d.get("logit_bias") or []}
    d["stop"] = tuple(d.get("stop") or ())
    return GenerationParams(**d)


def encode(events: list[RowEvent]) -> bytes:
    """An iteration's events as bytes; no events: empty bytes (the cheapest message)."""
    if not events:
        return b""
    out = []
    for e in events:
        item: dict[str, Any] = {"k": e.kind, "s": e.seq}
        if e.kind == SUBMIT:
            assert e.params is not None
            item.update(
                rid=e.rid,
                p=list(e.prompt),
                g=params_to_json(e.params),
                ns=e.ns,
                b=e.boundary,
            )
        if e.session is not None:
            item["se"] = e.session
        if e.restore:
            item["r"] = list(e.restore)
        out.append(item)
    return orjson.dumps(out)


def decode(data: bytes) -> list[RowEvent]:
    """The events `encode` wrote."""
    if not data:
        return []
    events = []
    for item in orjson.loads(data):
        if item["k"] == SUBMIT:
            events.append(
                RowEvent(
                    SUBMIT,
                    item["s"],
                    item["rid"],
                    tuple(item["p"]),
                    params_from_json(item["g"]),
                    item["ns"],
                    item["b"],
                    item.get("se"),
                    tuple(item.get("r") or ()),
                )
            )
        else:
            events.append(RowEvent(item["k"], item["s"], session=item.get("se")))
    return events


def encode_hello(h: Hello) -> bytes:
    return orjson.dumps(dataclasses.asdict(h))


def decode_hello(data: bytes) -> Hello:
    return Hello(**orjson.loads(data))
