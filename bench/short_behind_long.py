"""`python -m bench.short_behind_long`: a short chat sent while a long prompt prefills on one
model, against a running server (mlxd or mlx_lm.server: the OpenAI chat API of both).

    mlxd start &                                   # or: prefill_target_s = 0 in config.toml
    python -m bench.short_behind_long --url http://127.0.0.1:8080

Why (issue 33): a busy step prefills a chunk of the long prompt before each decode step of
the short one, so on a slow device (the CPU, a large model on a Mac) the short request's
every token waits a chunk. Prints one JSON line: the short request's seconds (or how many
tokens it had when the client gave up), and how far the long prompt got meanwhile (from
mlxd's worker log when it is cut: `prompt_done`).
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import httpx


def _chat(url: str, body: dict, timeout_s: float, out: dict) -> None:
    t0 = time.monotonic()
    tokens = 0
    try:
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=timeout_s
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    tokens += 1
        out["seconds"] = round(time.monotonic() - t0, 2)
    except httpx.HTTPError as exc:
        out["error"] = f"{type(exc).__name__} after {time.monotonic() - t0:.0f} s"
    out["chunks"] = tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--model", default=None, help="the model (default: the server's default)")
    p.add_argument("--lines", type=int, default=420, help="lines of the long prompt (~18 tokens)")
    p.add_argument("--delay", type=float, default=6.0, help="seconds before the short one")
    p.add_argument("--short-tokens", type=int, default=12)
    p.add_argument("--timeout", type=float, default=600.0)
    a = p.parse_args()
    model = {"model": a.model} if a.model else {}
    text = " ".join(
        f"Line {i}: the harbour master logged vessel {i * 7} at dawn." for i in range(a.lines)
    )
    greedy = {"temperature": 0, "seed": 1, **model}
    warm: dict = {}
    _chat(
        a.url,
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **model},
        120,
        warm,
    )
    long: dict = {}
    short: dict = {}
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4, **greedy}
    t = threading.Thread(target=_chat, args=(a.url, body, a.timeout, long))
    t.start()
    time.sleep(a.delay)
    ask = {"messages": [{"role": "user", "content": "Name a colour."}], **greedy}
    _chat(a.url, {**ask, "max_tokens": a.short_tokens}, a.timeout - a.delay, short)
    t.join()
    print(json.dumps({"short": short, "long": long}))


if __name__ == "__main__":
    main()
