"""Engine-facing generation parameters: what a request asks of the sampler and the stop logic.

Wire models convert themselves into this (`to_generation_params()`); the worker's engine reads
only this, so every API surface shares one generation path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
