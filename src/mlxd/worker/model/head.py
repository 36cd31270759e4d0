"""The model's output head on one position per row: a prefill forward's first-token logits.

A row's first token is sampled from the logits at its last prompt token. Taken from the
prefill forward that writes that token's KV (engine/step/generator.py), it saves a decode
forward per newcomer; but the head of a whole chunk would cost chunk x vocabulary logits per
row (2,048 positions of a 151k vocabulary: 600 MB of bf16), where one position is needed.

`gathered(site, positions)` puts a module in the head's place for one forward that keeps only
`positions[i]` of row i before the head runs (the head is per position, so the logits there
are the ones the whole chunk would have had). The head is the module named `lm_head`, or for
tied embeddings `embed_tokens`'s `as_linear`: mlx-lm's models call one of the two on the last
norm's output. `find_site` finds it; `probe` checks at load, on the model itself, that a
gathered forward gives the full forward's last logits (a family whose head is elsewhere gives
the whole chunk's, and is then served the usual way).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from mlxd.worker.model import blocks
from mlxd.worker.model.modules import modules_named, parent_of

log = logging.getLogger("mlxd.worker.model")

# Ids every vocabulary has; eight positions, so a gathered forward differs in shape.
PROBE_IDS = list(range(20, 28))
# Largest mean |difference| of log-probabilities (nats) between the gathered and the full
# forward's last position: a different matmul shape moves float arithmetic by far less.
MAX_MEAN_DIFF = 0.05


def _pick(x: mx.array, positions: mx.array) -> mx.array:
    """(B, L, D) -> (B, 1, D): row i's position positions[i]."""
    return x[mx.arange(x.shape[0]), positions][:, None, :]


class _GatherLinear(nn.Module):
    """An `lm_head` that sees only the chosen positions."""

    def __init__(self, inner, positions: mx.array):
        super().__init__()
        self.inner = inner
        self.positions = positions

    def __call__(self, x):
        return self.inner(_pick(x, self.positions))


class _GatherEmbedding(_GatherLinear):
    """A tied embedding: looks tokens up as before; its `as_linear` sees only the positions."""

    def __call__(self, x):
        return self.inner(x)

    def as_linear(self, x):
        return self.inner.as_linear(_pick(x, self.positions))


@dataclass(frozen=True)
class Site:
    """Where the head hangs: `parent[name]`, an `lm_head` or a tied `embed_tokens`."""

    parent: nn.Module
    name: str

    @property
    def tied(self) -> bool:
        return self.name == "embed_tokens"


def find_site(model: nn.Module) -> Site | None:
    """The model's output head (one `lm_head`, else one `embed_tokens`), or None."""
    for name in ("lm_head", "embed_tokens"):
        named = modules_named(model, name)
        if len(named) == 1:
            return Site(parent_of(model, named[0][0]), name)
        if named:
            return None
    return None


@contextmanager
def gathered(site: Site, positions: mx.array) -> Iterator[None]:
    """For the forwards inside: the head runs on row i's position `positions[i]` only."""
    inner = site.parent[site.name]
    wrap = _GatherEmbedding if site.tied else _GatherLinear
    site.parent[site.name] = wrap(inner, positions)
    try:
        yield
    finally:
        site.parent[site.name] = inner


def choose(model: nn.Module, wanted: bool, trimmable: bool) -> Site | None:
    """The head a row's first token is read from in its prefill forward, or None for
    mlx-lm's order (a decode forward of the last prompt token): plain KV only (a boundary
    snapshot of other caches is taken before that token enters them), not with whole-block
    prefill (blocks.py), and only where the probe finds the head."""
    if not (wanted and trimmable and blocks.block == 0):
        return None
    site = probe(model)
    if site is not None:
        log.info("first tokens from the prefill forward (its head on one position a row)")
    return site


def probe(model: nn.Module) -> Site | None:
    """The head's site if a gathered forward gives the full forward's last logits, else None
    (logged: the model's first tokens then come from a decode forward, as mlx-lm's do)."""
    site = find_site(model)
    if site is None:
        log.info("first tokens come from a decode forward: no output head found")
        return None
    ids = mx.array([PROBE_IDS])
    try:
        full = model(ids, cache=make_prompt_cache(model))
        with gathered(site, mx.array([len(PROBE_IDS) - 1])):
            part = model(ids, cache=make_prompt_cache(model))
        mx.eval(full, part)
    except Exception as exc:  # not a language model's forward (an embedding model's backbone)
        log.info("first tokens come from a decode forward: the probe failed (%s)", exc)
        return None
    if full.ndim != 3 or part.ndim != 3:
        log.info("first tokens come from a decode forward: the model gives no logits")
        return None
    full = full[:, -1, :]
    if part.shape[1] != 1 or part.shape[-1] != full.shape[-1]:
        log.info("first tokens come from a decode forward: the head is not where mlxd looks")
        return None

    def logprobs(x: mx.array) -> mx.array:
        x = x.astype(mx.float32).reshape(-1)
        return x - mx.logsumexp(x)

    diff = float(mx.abs(logprobs(part) - logprobs(full)).mean())
    if diff > MAX_MEAN_DIFF:
        log.warning("first tokens come from a decode forward: a gathered head moved by %.3f", diff)
        return None
    return site
