"""The engine's step trace: what each step did, for tests that prove order (never timing) and
for the step log (steplog.py), where operators and bench read how long each step took.

`Engine(..., trace=callback)` calls `callback(StepTrace)` on the engine thread after every
step; None (the default) costs nothing. Rows are named by their request id.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepTrace:
    """One engine step."""

    step: int  # 1, 2, ... (warm-up steps are not counted)
    chunk: int  # the planned prefill chunk (tokens per prefilling row)
    admitted: list[str] = field(default_factory=list)  # rows handed to the batch before it
    chunks: dict[str, tuple[int, int]] = field(default_factory=dict)  # rid: (start, tokens)
    decoded: list[str] = field(default_factory=list)  # rows that got a token
    finished: list[str] = field(default_factory=list)  # rows that left the batch
    queued: int = 0  # rows still waiting for room after it
    started: float = 0.0  # time.perf_counter() when the step began
    seconds: float = 0.0  # how long the step took, its rows' events included
    failed: str = ""  # the error that failed the step (its rows were rebuilt), else ""
    preempted: list[str] = field(default_factory=list)  # rows preempted before it (KV budget)
    sent_first: list[str] = field(default_factory=list)  # rows sent a token drawn in it (emit)
