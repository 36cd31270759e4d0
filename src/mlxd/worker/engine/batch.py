"""The rows in flight: mlx-lm's BatchGenerator and the Row each of its uids stands for.

Lives on the engine thread. Every way out of the batch goes through here (finished, cancelled,
failed, carried over a rebuild), and a row that leaves hands its prompt state to the prompt
cache on the way out, so the next request with that prefix skips its prefill.
"""

from __future__ import annotations

import logging

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences

from mlxd.shared.errors import MlxdError
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.cache.replies import Reply
from mlxd.worker.engine.recovery import Broken, generation_failed
from mlxd.worker.engine.rows import Event, FirstTokens, Row, Submission
from mlxd.worker.lora.slots import Adapters
from mlxd.worker.model import mlx_lm_seam as seam
from mlxd.worker.model.head import Site
from mlxd.worker.vision.encode import encode_row
from mlxd.worker.vision.load import VisionParts

log = logging.getLogger("mlxd.worker.engine.loop")


class Batch:
    """Rows by generator uid (and by submission), plus the counters of how they ended."""

    def __init__(
        self,
        cache: PromptCache | None,
        trimmable: bool,
        adapters: Adapters | None = None,
        vision: VisionParts | None = None,
    ):
        self.cache = cache
        self.adapters = adapters  # each row's LoRA slot, bound by uid (worker/lora/)
        self.vision = vision  # image rows' features, bound by uid (worker/vision/)
        # Trimmable caches (plain KV) serve any shared prefix, so one snapshot per request at
        # its end suffices; other cache types need snapshots at exact prompt boundaries.
        self.trimmable = trimmable
        self.gen: BatchGenerator | None = None  # made on the engine thread (its MLX stream)
        self.eos: StopSequences | None = None
        self.eos_ids: frozenset[int] = frozenset()  # the tokens `eos` stops at
        self.rows: dict[int, Row] = {}
        self._by_sub: dict[int, Row] = {}
        self.broken: Broken = []  # rows whose own code raised during this step (the guards)
        self.requests_done = 0
        self.cancellations = 0
        self.recoveries = 0  # failed steps after which the batch was rebuilt (recovery.py)
        self.first_tokens = FirstTokens()
        # The model's output head (model/head.py) when a row's first token comes from its
        # prefill forward (its last prompt token prefilled with the rest); None: from a
        # decode forward of that token, as mlx-lm does.
        self.head: Site | None = None

    @property
    def held_back(self) -> int:
        """Prompt tokens a row leaves for its first decode forward (1) or none (0)."""
        return 0 if self.head is not None else 1

    def insert(self, segments: list[list[int]], **kwargs) -> int:
        """Insert one row (its prompt `segments` past its cached prefix) into the generator;
        its uid. With `head`, its last prompt token is prefilled with the chunk before it."""
        gen = self.generator()
        uid = gen.insert_segments([segments], **kwargs)[0]
        if self.head is not None:
            seam.fold_last_token(gen, uid)
        return uid

    def __len__(self) -> int:
        return len(self.rows)

    def generator(self) -> BatchGenerator:
        """The generator rows live in."""
        assert self.gen is not None  # the engine thread makes it before it admits any row
        return self.gen

    def slot_for(self, sub: Submission, held: int = 0) -> int:
        """The adapter slot `sub`'s row runs with, loaded if need be (before its insertion)."""
        if self.adapters is None or sub.adapter is None:
            return 0
        return self.adapters.slot_for(sub.adapter, held)

    def images_for(self, sub: Submission, cached: int):
        """The features of `sub`'s image positions past its `cached` prefix (None: none to
        prefill), encoded now, before its insertion: a failure fails this row alone."""
        if sub.images is None:
            return None
        if self.vision is None:
            raise ValueError("this model has no vision tower")
        with mx.stream(self.generator().stream):  # the engine thread's own stream
            return encode_row(self.vision, sub.images, sub.prompt, cached)

    def add(self, row: Row, images=None) -> None:
        self.rows[row.uid] = row
        self._by_sub[id(row.sub)] = row
        if self.adapters is not None:
            self.adapters.bind(row.uid, id(row.sub), row.slot)
        if self.vision is not None:
            self.vision.rows.bind(row.uid, images)

    def _unbind(self, row: Row) -> None:
        if self.adapters is not None:
            self.adapters.unbind(row.uid, id(row.sub))
        if self.vision is not None:
            self.vision.rows.unbind(row.uid)

    def resume(self, row: Row) -> None:
        """Put `row` into a fresh batch where it was (a failed step's rebuild): prompt plus
        the tokens already sent, prefilled again."""
        self.reinsert(row)
        row.resumed = True

    def reinsert(self, row: Row, layers: list | None = None, cached: int = 0) -> None:
        """Insert `row` again as prompt plus the tokens it sent, its first `cached` positions
        from `layers` (a prompt-cache prefix; None: all prefilled again). Its next token is
        the one it would have written; raises on an MLX error (this row only)."""
        seq = [*row.sub.prompt, *row.tokens]
        row.sent_ahead = False  # its next token is drawn again, after the tokens it sent
        row.slot = self.slot_for(row.sub, row.slot)
        images = self.images_for(row.sub, cached)
        max_tokens = row.sub.params.max_tokens
        assert max_tokens is not None  # resolve_params fixed it before the submission
        assert self.eos is not None  # set with the generator
        row.uid = self.insert(
            [seq[cached:]],
            max_tokens=[max(1, max_tokens - row.generated)],
            # mlx-lm fills a None entry with fresh caches (its own default)
            caches=[layers],
            all_tokens=[seq[:cached]],
            samplers=[row.sampler],
            logits_processors=[row.processors],
            stop_sequences=[self.eos],
        )
        row.pos, row.todo, row.started = cached, len(seq) - cached - self.held_back, False
        self.add(row, images)

    def park(self, row: Row) -> None:
        """Take `row` out to resume later (a preemption): its KV, prompt and tokens so far,
        goes to the prompt cache, where its resumption finds it (sched/preempt.py)."""
        self.remove_keeping_cache(row)
        self.rows.pop(row.uid, None)
        self._by_sub.pop(id(row.sub), None)
        self._unbind(row)

    def drop(self, sub: Submission) -> None:
        """A cancelled request leaves; with a `cancel_reason`, it hears why."""
        row = self._by_sub.pop(id(sub), None)
        if row is None:
            return
        self.remove_keeping_cache(row)
        del self.rows[row.uid]
        self._unbind(row)
        self.cancellations += 1
        if sub.cancel_reason is not None:
            sub.sink(Event.failure(sub.cancel_reason, row.generated))

    def finish(self, row: Row) -> None:
        self.release(row)
        self.requests_done += 1

    def release(self, row: Row) -> None:
        """Let go of `row` without ending it (it waits in the queue to come back)."""
        self.rows.pop(row.uid, None)
        self._by_sub.pop(id(row.sub), None)
        self._unbind(row)

    def fail(self, uid: int, err: MlxdError) -> None:
        """End one row in error; the rest of the batch goes on."""
        row = self.rows.get(uid)
        if row is None:
            return
        try:
            self.generator().remove([uid])
        except Exception:
            log.exception("removing row %s failed", uid)
        self.finish(row)
        row.sub.sink(Event.failure(err, row.generated))

    def fail_broken(self) -> None:
        """Fail the rows a guard caught during the step that just ran."""
        for sub, exc in self.broken:
            if (row := self._by_sub.get(id(sub))) is not None:
                self.fail(row.uid, generation_failed(sub.rid, exc))
        self.broken.clear()

    def fail_all(self, err: MlxdError) -> None:
        """The engine thread is stopping unexpectedly: every row hears `err`."""
        rows = list(self.rows.values())
        if rows and self.gen is not None:
            try:
                self.gen.remove([row.uid for row in rows])
            except Exception:
                log.exception("clearing the batch failed")
        for row in rows:
            self.finish(row)
            try:
                row.sub.sink(Event.failure(err))
            except RuntimeError:  # the event loop is already closed: nobody is waiting
                pass

    # -- the prompt cache -----------------------------------------------------------------
    def remove_keeping_cache(self, row: Row) -> None:
        """Take a row out of the batch; its prompt state goes to the cache on the way out."""
        if self.cache is None:
            self.generator().remove([row.uid])
            return
        for cache, tokens in self.generator().remove([row.uid], return_prompt_caches=True).values():
            self.store(row, tokens, cache)

    def store(self, row: Row, tokens, layers) -> None:
        # A row cancelled before its prefill holds only what it was given from the cache.
        if self.cache is not None and layers and len(tokens) > row.sub.prompt_cached:
            sub = row.sub
            # The entry remembers the ids this row generated (and those its prompt got back
            # from earlier turns): the next turn re-sends them as text (cache/replies.py).
            replies = sub.replies
            if row.tokens:
                replies += (Reply(len(sub.prompt), tuple(row.tokens)),)
            self.cache.store(sub.ns, tuple(tokens), layers, sub.session, sub.prompt_cached, replies)

    def snapshot(self, prompt_responses) -> None:
        """Non-trimmable caches: keep the state at each prompt segment's end."""
        uids = [
            r.uid
            for r in prompt_responses
            if r.end_of_segment and not r.end_of_prompt and r.uid in self.rows
        ]
        if not uids or self.cache is None:
            return
        for uid, (cache, tokens) in self.generator().extract_cache(uids).items():
            self.store(self.rows[uid], tokens, cache)
