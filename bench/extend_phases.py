"""Where a cached-extension prefill's time goes (`python -m bench extend --phases`), and the
attention variants `--variant` tries, in the bench's own process only.

Phases: each wrapped call synchronizes the device before and after and evaluates what it
made, so lazy work is charged to the phase that queued it (the synchronizing slows the whole
a little; the split is what counts). Inclusive: `prompt` holds `forward` and `finalize`.
- merge: mlx-lm's PromptProcessingBatch built from the rows' cached KV (a padded copy each);
- forward: the model on a prefill chunk (attention included);
- finalize: BatchKVCache.finalize (right padding rolled into left padding: the whole KV);
- split: rows leaving prefill for decode (mlx-lm deep-copies the prompt batch's KV);
- join: the decode batch taking them in (their KV copied into the decode batch's buffer).
Attention: calls by route (attention.routed), and the distinct shapes sent to the fused
causal kernel row by row (on CUDA, each new shape is a cuDNN graph build).

Variants (attention's routing; CUDA only, where `routed` is installed):
- default: as the worker runs;
- row-unfused: a left-padded batch's rows each through `unfused` when that row's scores fit
  under the small bound (no graph build per row shape), else fused as today;
- fused: MLX's own kernel for every call (routing off).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable

VARIANTS = ("default", "row-unfused", "fused")


class Phases:
    def __init__(self, mx) -> None:
        self.mx = mx
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.shapes: set[tuple] = set()
        self.seen: set[tuple] = set()  # every multi-token shape the fused kernel met, all run
        self.new_shapes = 0  # of them, first met since the last reset: cuDNN builds on CUDA
        self._undo: list[Callable[[], None]] = []

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.shapes.clear()
        self.new_shapes = 0

    def _wrap(self, owner, name: str, label: str, state: Callable | None = None) -> None:
        orig = getattr(owner, name)
        mx, seconds, calls = self.mx, self.seconds, self.calls

        def timed(*a, **kw):
            mx.synchronize()
            t0 = time.perf_counter()
            out = orig(*a, **kw)
            if state is not None:
                mx.eval(state(a, out))
            mx.synchronize()
            seconds[label] += time.perf_counter() - t0
            calls[label] += 1
            return out

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, orig))

    def install(self, variant: str) -> None:
        from mlx_lm.generate import PromptProcessingBatch
        from mlx_lm.models.cache import BatchKVCache

        from mlxd.worker.engine.step.decode import DecodeBatch
        from mlxd.worker.model import attention

        def caches(a, _out):
            return [c.state for c in a[0].prompt_cache]

        self._wrap(PromptProcessingBatch, "__init__", "merge", caches)
        self._wrap(PromptProcessingBatch, "prompt", "prompt")
        self._wrap(PromptProcessingBatch, "split", "split", lambda a, out: caches((out,), None))
        self._wrap(BatchKVCache, "finalize", "finalize", lambda a, _o: a[0].state)
        self._wrap(DecodeBatch, "extend", "join")
        self._variant(attention, variant)

    def wrap_model(self, model) -> None:
        """The model's forward, evaluated: `forward` (prefill chunks and decode steps alike)."""
        cls = type(model)
        orig = cls.__call__
        mx, seconds, calls = self.mx, self.seconds, self.calls

        def forward(this, inputs, *a, **kw):
            mx.synchronize()
            t0 = time.perf_counter()
            out = orig(this, inputs, *a, **kw)
            mx.eval(out)
            mx.synchronize()
            label = "forward (prefill)" if inputs.shape[-1] > 1 else "forward (decode)"
            seconds[label] += time.perf_counter() - t0
            calls[label] += 1
            return out

        cls.__call__ = forward
        self._undo.append(lambda: setattr(cls, "__call__", orig))

    def _variant(self, attention, variant: str) -> None:
        from mlxd.worker.model import mlx_lm_seam as seam

        calls, shapes = self.calls, self.shapes
        fused, unfused, is_small = attention._fused, attention.unfused, attention.is_small
        orig_rows = attention.row_by_row

        def row_by_row(q, k, v, scale, left):
            calls["attention: row by row"] += 1
            if variant != "row-unfused":
                for p in left:
                    shapes.add((q.shape[2], k.shape[2] - p))
                return orig_rows(q, k, v, scale, left)
            out = []
            for i, p in enumerate(left):
                qi, ki, vi = q[i : i + 1], k[i : i + 1, :, p:], v[i : i + 1, :, p:]
                if is_small(qi, ki):
                    out.append(unfused(qi, ki, vi, scale, "causal"))
                else:
                    shapes.add((q.shape[2], k.shape[2] - p))
                    out.append(fused(qi, ki, vi, scale=scale, mask="causal"))
            return mx_concat(out)

        def mx_concat(parts):
            return self.mx.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]

        attention.row_by_row = row_by_row
        self._undo.append(lambda: setattr(attention, "row_by_row", orig_rows))

        def counted(q, k, v, **kw):  # attention looks `_fused` up at each call
            shape = (q.shape[0], q.shape[2], k.shape[2])
            if q.shape[2] > 1 and shape not in self.seen:
                self.seen.add(shape)
                self.new_shapes += 1
            return fused(q, k, v, **kw)

        attention._fused = counted
        self._undo.append(lambda: setattr(attention, "_fused", fused))
        if variant == "fused" and seam.sdpa() is attention.routed:
            seam.patch_sdpa(seam.ORIGINAL_SDPA)
            self._undo.append(lambda: seam.patch_sdpa(attention.routed))

    def table(self, wall: float) -> str:
        rows = [f"| phase | calls | s | share of {wall:.3f} s |", "|---|---|---|---|"]
        for label, s in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            rows.append(f"| {label} | {self.calls[label]} | {s:.3f} | {s / wall:.0%} |")
        for label, n in sorted(self.calls.items()):
            if label.startswith("attention"):
                rows.append(f"| {label} | {n} | | |")
        rows.append(f"| distinct row shapes to the fused kernel | {len(self.shapes)} | | |")
        rows.append(f"| fused prefill shapes not met before (builds) | {self.new_shapes} | | |")
        return "\n".join(rows)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()
