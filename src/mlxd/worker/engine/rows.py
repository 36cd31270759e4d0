"""What passes between a request and the engine thread: submissions in, events out, and the
Row a submission becomes in the batch. The commands that carry submissions are in inbox.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlxd.shared.errors import MlxdError
from mlxd.shared.params import GenerationParams

if TYPE_CHECKING:  # no MLX at import time: the inbox and recovery are unit-tested without it
    from mlxd.worker.engine.textstream import TextStream
    from mlxd.worker.vision.prompt import VisionInput


@dataclass
class Event:
    """What the engine tells a request after a step: new text, and maybe the end."""

    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[dict] | None = None
    error: MlxdError | None = None

    @classmethod
    def failure(cls, err: MlxdError, completion_tokens: int = 0) -> Event:
        """The last event of a row that ends in error."""
        return cls(completion_tokens=completion_tokens, finish_reason="error", error=err)


@dataclass(eq=False)
class Submission:
    """One request handed to the engine. `sink` is called on the engine thread."""

    rid: str
    prompt: list[int]
    params: GenerationParams
    sink: Callable[[Event], None]
    prompt_cached: int = 0  # set by the engine when the row is admitted
    # Prompt tokens processed so far, cached ones included (the engine's, read by the log).
    prompt_done: int = 0
    ns: str = ""  # prompt-cache namespace (what changes the KV)
    session: str | None = None  # session affinity for the prompt cache
    boundary: int = 0  # stable prompt boundary (multi-turn snapshot point), 0: none
    restored: tuple | None = None  # (SsdEntry, arrays) read from the SSD tier for this prompt
    replies: tuple = ()  # earlier replies' generated ids in `prompt` (cache/replies.py)
    adapter: str | None = None  # the LoRA adapter this row runs with (worker/lora/)
    images: VisionInput | None = None  # its images, as the processor made them (vision/)
    # Extra per-row logits processors (e.g. a grammar), run after penalties and bias.
    processors: list = field(default_factory=list)
    cancelled: bool = False
    cancel_reason: MlxdError | None = None
    submitted_at: float = field(default_factory=time.monotonic)  # when it reached the engine
    oom_waits: int = 0  # times an allocation failure sent it back to the queue (sched/oom.py)


@dataclass
class FirstTokens:
    """Where the time to each row's first token went, summed over the engine's life: waiting
    for room in the batch (submitted -> admitted), then admitted -> first token (prefill,
    and the steps it shared). /stats and /metrics report them."""

    count: int = 0
    queue_s: float = 0.0
    prefill_s: float = 0.0

    def add(self, row: Row) -> None:
        self.count += 1
        self.queue_s += max(0.0, row.admitted_at - row.sub.submitted_at)
        self.prefill_s += max(0.0, time.monotonic() - row.admitted_at)


@dataclass(eq=False)
class Row:
    """A submission admitted into the batch, with what it takes to resume it elsewhere."""

    sub: Submission
    uid: int
    text: TextStream
    sampler: Callable  # admission's guarded sampler (recovery.GuardedSampler)
    processors: list = field(default_factory=list)  # everything the batch runs for this row
    tokens: list[int] = field(default_factory=list)  # generated so far, as the client saw them
    generated: int = 0
    # Its token drawn last was sent at the end of the step that drew it (emit.send_first):
    # the decode step that returns that token again sends nothing.
    sent_ahead: bool = False
    resumed: bool = False  # carried over a failed step once already
    admitted_at: float = field(default_factory=time.monotonic)
    # Prefill progress in this batch, for the planner (schedule.py) and the trace.
    pos: int = 0  # prompt position the next prefill chunk starts at
    todo: int = 0  # prompt tokens left to prefill (the last one goes with the first decode)
    started: bool = False  # it has had a prefill chunk (or went straight to decode)
    kv_tokens: int = 0  # positions the KV budget counts it at (kv/reserve.py)
    slot: int = 0  # its adapter's slot while in the batch (worker/lora/; 0: the base)
    seq: int = 0  # admission order (kept over a preemption): the newest are preempted first


def not_decoding(row: Row) -> bool:
    """Not through a decode step yet: no token, or only its first, which went out at the end
    of the step that drew it (emit.send_first), before the decode step that returns it."""
    return row.generated == 0 or row.generated == 1 and row.sent_ahead
