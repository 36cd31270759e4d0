"""Engine-facing generation parameters: what a request asks of the sampler and the stop logic.

Wire models convert themselves into this (`to_generation_params()`); the worker's engine reads
only this, so every API surface shares one generation path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mlxd.shared.errors import BadRequest

# Model-independent bounds every API surface applies to what it accepts; bounds that depend on
# the model (vocabulary, context) are checked where the worker resolves the parameters.
# mx.random.key takes an unsigned 64-bit seed: a negative or larger one would fail the row.
MIN_SEED = 0
MAX_SEED = 2**64 - 1
# Stop strings are scanned for at every token (their prefixes too): a long one costs each step.
MAX_STOP_CHARS = 256
MAX_STOP_SEQUENCES = 16  # stop strings a request may give, on every surface
MAX_PENALTY_WINDOW = 256


def check_stop_strings(stops: list[str]) -> None:
    """Each stop string non-empty and at most MAX_STOP_CHARS; ValueError says which rule (a
    wire model's validator turns it into its surface's 400)."""
    if any(s == "" for s in stops):
        raise ValueError("stop sequences must not be empty")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ValueError(f"stop sequences must be at most {MAX_STOP_CHARS} characters")


Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
EFFORTS: tuple[str, ...] = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# A reasoning effort as a thinking budget: the smaller of a fixed count and a share of the row's
# max_tokens. The count keeps "high" from thinking for 100K tokens on a long-context model; the
# share leaves room for the answer when max_tokens is small. "max" is no budget at all.
EFFORT_BUDGETS: dict[str, tuple[int, float] | None] = {
    "none": (0, 0.0),
    "minimal": (256, 0.125),
    "low": (1024, 0.25),
    "medium": (4096, 0.5),
    "high": (16384, 0.75),
    "xhigh": (32768, 0.875),
    "max": None,
}


def effort_of(value: Any, param: str) -> Effort | None:
    """A reasoning effort from a body's free-form object: one of EFFORTS or None, else a 400."""
    if value is not None and value not in EFFORTS:
        raise BadRequest(
            f"Invalid '{param}': must be one of {', '.join(EFFORTS)} (got {value!r:.40})",
            param=param,
        )
    return value


@dataclass(frozen=True)
class GenerationParams:
    """Sampling, penalties and stop conditions for one row of the batch."""

    max_tokens: int | None = None  # None: up to the context limit
    # Set by the worker: no budget was asked for (request or model default), so max_tokens is
    # the context's room, and the worker may lower it to what its KV budget holds for the row.
    max_tokens_open: bool = False
    temperature: float | None = None  # None: the model's generation_config default
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    # How many recent tokens (prompt included) the penalties look at; None: 20, 0: none,
    # at most MAX_PENALTY_WINDOW (each one costs every step).
    penalty_window: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    context_window: int | None = None  # a request's own, smaller context (Ollama's num_ctx)
    speculative: bool | None = None  # False: never draft for this row; None: the model's setting
    # Reasoning tokens the row may spend before the engine closes the block (worker/chat/
    # think_budget.py); `reasoning_effort` becomes one through EFFORT_BUDGETS once max_tokens
    # is known. Both None: no budget.
    reasoning_budget: int | None = None
    reasoning_effort: Effort | None = None

    def thinking_budget(self) -> int | None:
        """The reasoning budget in tokens: the one asked for, else the effort's share of
        max_tokens (EFFORT_BUDGETS), else None (think as long as max_tokens allows)."""
        if self.reasoning_budget is not None:
            return self.reasoning_budget
        share = EFFORT_BUDGETS.get(self.reasoning_effort or "max")
        if share is None:
            return None
        count, fraction = share
        return count if self.max_tokens is None else min(count, int(self.max_tokens * fraction))
