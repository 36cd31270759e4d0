"""The parts of `python -m bench vision` (bench/vision.py says what each measures): one run
of the turns and the mix against mlxd and mlx-vlm's generate, the figures as they fill."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .client import StreamResult, Target, stream_chat
from .context import Figure, _order, _percentile, filler
from .models import load_text_tokenizer, no_eos_bias
from .vision_setup import (
    BASE,
    COLD,
    VisionSizes,
    figures,
    openai_parts,
    vlm_parts,
    write_png,
)
from .vision_sides import Baseline


@dataclass
class Bench:
    """One run of everything: the servers, the prompts, the figures as they fill."""

    sz: VisionSizes
    model: Path
    work: Path
    mlxd: Target
    base: Baseline
    notes: list[str]
    figs: dict[str, Figure] = dataclasses.field(init=False)

    def __post_init__(self):
        self.figs = figures(self.sz)
        self.tok = load_text_tokenizer(self.model)
        self.bias = no_eos_bias(self.model)
        self._seed = 1000
        self._nonce = 0
        self._run = os.urandom(3).hex()

    def image(self) -> Path:
        self._seed += 1
        path = self.work / "images" / f"{self._seed}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_png(self._seed, self.sz.image_px, path)

    def question(self, tag: str) -> str:
        self._nonce += 1
        words = filler(self.sz.question, f"{tag}{self._run}-{self._nonce}", self.tok)
        return f"Look at the picture. {words}"

    async def mlxd_chat(self, http, messages, max_tokens: int) -> StreamResult:
        return await stream_chat(http, self.mlxd, messages, max_tokens, self.bias)

    async def warm(self) -> None:
        """Untimed: the model's load, each path's first use (image encode, text prefill)."""
        img, q = self.image(), self.question("warm")
        async with self.mlxd.session() as http:
            for image in (img, None):
                await self.mlxd_chat(http, [{"role": "user", "content": openai_parts(q, image)}], 4)
        for image in (img, None) if self.base.alive else ():
            await self.base.job(
                op="ask", messages=[{"role": "user", "content": vlm_parts(q, image)}],
                images=[str(image)] if image else [], max_tokens=4,
            )  # fmt: skip

    async def turns(self, run: int) -> None:
        """Turn 1 with a fresh image, then turn 2 about it, on both."""
        img, q1, q2 = self.image(), self.question("q1"), self.question("q2")
        # One assistant reply for both (a random model's own replies differ by server, and
        # re-encoded they are not the ids it sampled): the same turn 2 prompt on both sides.
        reply = filler(self.sz.reply, f"reply{self._run}-{run}", self.tok)
        for who in _order(self.sides(), run):
            if who == "mlxd":
                async with self.mlxd.session() as http:
                    msgs = [{"role": "user", "content": openai_parts(q1, img)}]
                    first = await self.mlxd_chat(http, msgs, self.sz.reply)
                    msgs += [
                        {"role": "assistant", "content": reply},
                        {"role": "user", "content": q2},
                    ]
                    second = await self.mlxd_chat(http, msgs, self.sz.reply)
                t1, t2 = first.ttft_s, second.ttft_s
                if second.cached_tokens is not None and second.prompt_tokens:
                    self.figs["hit"].add("mlxd", 100 * second.cached_tokens / second.prompt_tokens)
                self.figs["vs_cold"].add("mlxd", t2)
                self.figs["vs_cold"].add(COLD, t1)
                self._once(
                    "mlxd prompt tokens",
                    f"turn 1 {first.prompt_tokens}, turn 2 {second.prompt_tokens} "
                    f"({second.cached_tokens} cached)",
                )
            else:
                msgs = [{"role": "user", "content": vlm_parts(q1, img)}]
                one = await self.base.job(
                    op="ask", messages=msgs, images=[str(img)], max_tokens=self.sz.reply,
                    state=run,
                )  # fmt: skip
                msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": q2}]
                two = await self.base.job(
                    op="ask", messages=msgs, images=[str(img)], max_tokens=self.sz.reply,
                    state=run,
                )  # fmt: skip
                t1, t2 = one["ttft_s"], two["ttft_s"]
                self._once("mlx-vlm prompt tokens", f"turn 1 {one['prompt_tokens']}, "
                           f"turn 2 {two['prompt_tokens']}")  # fmt: skip
            self.figs["cold"].add(who, t1)
            self.figs["warm"].add(who, t2)

    async def mix(self, run: int) -> None:
        """--clients rows at once on mlxd; the same rows one after another on mlx-vlm."""
        n_img = min(self.sz.image_rows, self.sz.clients)
        rows = [(self.question("mix"), self.image() if i < n_img else None)
                for i in range(self.sz.clients)]  # fmt: skip
        for who in _order(self.sides(), run):
            if who == "mlxd":
                async with self.mlxd.session() as http:
                    t0 = time.monotonic()
                    rs = await asyncio.gather(*(
                        self.mlxd_chat(http, [{"role": "user", "content": openai_parts(q, im)}],
                                       self.sz.mix_tokens)
                        for q, im in rows
                    ))  # fmt: skip
                    wall = time.monotonic() - t0
                ttfts = [r.ttft_s for r in rs]
                tokens = [r.completion_tokens for r in rs]
            else:
                out = await self.base.job(
                    op="mix", max_tokens=self.sz.mix_tokens,
                    rows=[{"messages": [{"role": "user", "content": vlm_parts(q, im)}],
                           "images": [str(im)] if im else []} for q, im in rows],
                )  # fmt: skip
                wall = out["wall_s"]
                ttfts = [r["queued_ttft_s"] for r in out["rows"]]
                tokens = [r["completion_tokens"] for r in out["rows"]]
            short = [t for t in tokens if t != self.sz.mix_tokens]
            if short:
                self._once(f"{who} short", f"outputs {short} of {self.sz.mix_tokens} tokens")
            got = {
                "wall": wall,
                "agg": sum(tokens) / wall,
                "p50": _percentile(ttfts, 0.5),
                "p90": _percentile(ttfts, 0.9),
            }
            if n_img:
                got["img50"] = _percentile(ttfts[:n_img], 0.5)
            if n_img < len(ttfts):
                got["txt50"] = _percentile(ttfts[n_img:], 0.5)
            for key, value in got.items():
                self.figs[key].add(who, value)

    def sides(self) -> list[str]:
        """mlxd, and mlx-vlm while its process lives (mlxd's figures go on without it)."""
        return ["mlxd", BASE] if self.base.alive else ["mlxd"]

    def _once(self, key: str, text: str) -> None:
        if not any(n.startswith(key) for n in self.notes):
            self.notes.append(f"{key}: {text}")
