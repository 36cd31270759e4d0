"""Quantized KV (kv_bits) through a worker process: batched streams, SSD restores of quantized
entries, and the fingerprint keeping a 4-bit entry out of a 16-bit model."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from procs import start_worker, stop, uds_client, uds_openai

LONG = " ".join(f"Fact {i}: the river flows past stone number {i * 7}." for i in range(30))


def ask(oai, content: str, n: int = 12):
    return oai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], max_tokens=n, temperature=0
    )


def stream(oai, content: str) -> tuple[str, str]:
    text, finish = "", ""
    for chunk in oai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": content}],
        max_tokens=16,
        temperature=0,
        stream=True,
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def stats(sock) -> dict:
    with uds_client(sock) as c:
        return c.get("/stats").json()


@pytest.fixture
def cache_dir(short_tmp, request):
    d = short_tmp / f"kvq-{request.node.name[-24:]}"
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("bits", [pytest.param(8, marks=pytest.mark.slow), 4])
def test_quantized_kv_serves_batched_streams_and_restores_from_ssd(
    tiny_model_dir, short_tmp, cache_dir, bits
):
    sock = short_tmp / f"kvq{bits}.sock"
    flags = ("--kv-bits", str(bits), "--ssd-cache-dir", str(cache_dir))
    proc = start_worker(tiny_model_dir, sock, "tiny", *flags)
    try:
        oai = uds_openai(sock)
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda i: stream(oai, f"Stream {i}: {LONG}"), range(4)))
        assert all(text and finish == "length" for text, finish in outs), outs
        first = ask(oai, LONG)
        s = stats(sock)
        # 4 layers x 2 KV heads x (K, V) x (64 values at `bits` + a float32 scale and bias).
        assert (s["kv_bits"], s["kv_bytes_per_token"]) == (bits, 16 * (64 * bits // 8 + 8))
        with uds_client(sock) as c:
            assert c.post("/admin/drain").json()["cache_ssd_entries"] >= 1
    finally:
        assert stop(proc) == 0
    proc = start_worker(tiny_model_dir, sock, "tiny", *flags)
    try:
        again = ask(uds_openai(sock), LONG)
        assert again.usage.prompt_tokens_details.cached_tokens >= 0.9 * again.usage.prompt_tokens
        assert again.choices[0].message.content == first.choices[0].message.content
        s = stats(sock)
        assert s["cache_ssd_restores"] == 1 and s["cache_ssd_hits"] == 1
    finally:
        stop(proc)
    if bits != 4:
        return
    # The same cache root under the model's float KV: the 4-bit entries are not its own.
    proc = start_worker(tiny_model_dir, sock, "tiny", "--ssd-cache-dir", str(cache_dir))
    try:
        assert stats(sock)["cache_ssd_entries"] == 0
        r = ask(uds_openai(sock), LONG)
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert stats(sock)["cache_ssd_hits"] == 0
    finally:
        stop(proc)
