"""The baseline side of `python -m bench vision`: mlx-vlm's own generation in a process of
its own (`python -m bench.vision_baseline MODEL`), one JSON job per stdin line, one JSON
answer per stdout line, so the bench can alternate it with mlxd on a warm model.

mlx-vlm's server needs fastapi and uvicorn, which the GPU machines lack; its generator is what
that server streams from: `mlx_vlm.generate.stream_generate` on the rendered chat and the PNG
file, greedy, the stop tokens forbidden by logit_bias (as mlxd's requests are), so every row
makes exactly the tokens asked for. TTFT is the time from the call to its first yield: the
image's load and processing, the vision tower and the prefill, as mlxd's TTFT holds them.

Jobs: {"op": "ask", "messages": [...], "images": [paths], "max_tokens": n, "state": k}
(state k: the k-th PromptCacheState, mlx-vlm's own multi-turn reuse; null: none), and
{"op": "mix", "rows": [{"messages", "images"}...], "max_tokens": n}: the rows one after
another (mlx-vlm's generate has no batching), each row's TTFT from the mix's start too.
"""

from __future__ import annotations

import json
import sys
import time


class Baseline:
    """A loaded mlx-vlm model and the per-conversation prompt cache states."""

    def __init__(self, path: str):
        import mlx_vlm
        from mlx_vlm.generate import PromptCacheState

        self.model, self.processor = mlx_vlm.load(path)
        self.states: dict[int, PromptCacheState] = {}
        self._state = PromptCacheState
        config = json.loads(open(f"{path}/config.json").read())
        eos = config.get("eos_token_id")
        eos = eos if isinstance(eos, list) else [eos]
        self.bias = {int(i): -100.0 for i in eos if i is not None}

    def ask(self, messages: list[dict], images: list[str], max_tokens: int, state=None):
        """One generation, timed: (ttft, duration, completion tokens, prompt tokens)."""
        from mlx_vlm.generate import stream_generate
        from mlx_vlm.prompt_utils import get_chat_template

        extra = {}
        if state is not None:
            extra["prompt_cache_state"] = self.states.setdefault(state, self._state())
        t0 = time.monotonic()
        prompt = get_chat_template(self.processor, messages, add_generation_prompt=True)
        ttft, last = None, None
        for step in stream_generate(
            self.model,
            self.processor,
            prompt,
            image=images or None,
            max_tokens=max_tokens,
            temperature=0.0,
            logit_bias=self.bias,
            **extra,
        ):
            if ttft is None:
                ttft = time.monotonic() - t0
            last = step
        done = time.monotonic() - t0
        return {
            "ttft_s": ttft if ttft is not None else done,
            "duration_s": done,
            "completion_tokens": int(last.generation_tokens) if last else 0,
            "prompt_tokens": int(last.prompt_tokens) if last else 0,
            "text": last.text if last else "",
        }

    def handle(self, job: dict) -> dict:
        if job["op"] == "ask":
            return self.ask(job["messages"], job["images"], job["max_tokens"], job.get("state"))
        if job["op"] == "mix":
            t0, rows = time.monotonic(), []
            for row in job["rows"]:
                start = time.monotonic() - t0
                r = self.ask(row["messages"], row["images"], job["max_tokens"])
                rows.append({**r, "queued_ttft_s": start + r["ttft_s"]})
            return {"rows": rows, "wall_s": time.monotonic() - t0}
        raise ValueError(f"unknown op {job['op']!r}")


def cap_buffer_cache() -> None:
    """MLX's buffer cache capped as mlxd's workers (and bench/mlx_lm_capped.py) cap theirs,
    1/16 of the device: uncapped, two MLX processes on one GPU can run it out of memory."""
    import mlx.core as mx

    info = mx.device_info() if mx.default_device() != mx.cpu else {}
    total = next((info[k] for k in ("total_memory", "memory_size") if info.get(k)), 0)
    if total:
        mx.set_cache_limit(total // 16)


def main(argv: list[str]) -> int:
    answers, sys.stdout = sys.stdout, sys.stderr  # whatever mlx-vlm prints stays off the wire
    cap_buffer_cache()
    b = Baseline(argv[0])
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = b.handle(json.loads(line))
        except Exception as exc:  # the bench reports it and goes on with mlxd's figures
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), file=answers, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
