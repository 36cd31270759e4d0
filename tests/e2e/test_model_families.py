"""Every model family through the real daemon (tests/families.py: mlx-lm's own classes at toy
sizes): greedy rows in a batch of 8 give mlx-lm's single-row tokens, a conversation's second
turn reuses the first from RAM, the cache survives an unload (drain to the SSD tier) and the
reload restores it with the same answer, a stream cut mid-way leaves the model serving, and
the fit report plans for it."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import pytest
from families import FAMILIES, build_family_model
from mlx_lm import load
from mlx_lm.generate import generate_step

from procs import uds_client

TOKENS = 8
LONG = " ".join(f"Note {i}: the lighthouse keeper counted {i * 3} ships." for i in range(30))


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    return {f: build_family_model(tmp_path_factory.mktemp(f), f) for f in FAMILIES}


@pytest.fixture(scope="module")
def daemon(make_module_daemon, family_dirs):
    # Each family's SSD restore through a request (the read-ahead would make it a RAM hit).
    return make_module_daemon(models=family_dirs, env={"MLXD_SSD_READ_AHEAD": "false"})


@pytest.fixture(scope="module")
def reference(family_dirs):
    """mlx-lm's own model and tokenizer for a family, loaded once."""
    memo = {}

    def get(family):
        if family not in memo:
            memo[family] = load(str(family_dirs[family]))
        return memo[family]

    return get


def _greedy_text(model, tok, ids: list[int], n: int = TOKENS) -> str:
    out = []
    for (t, _), _ in zip(generate_step(mx.array(ids), model, max_tokens=n), range(n)):
        if int(t) in tok.eos_token_ids:
            break
        out.append(int(t))
    return tok.decode(out)


def _chat(oai, family, messages, **kw):
    return oai.chat.completions.create(
        model=family, messages=messages, max_tokens=TOKENS, temperature=0, **kw
    )


def _worker_stats(daemon, family) -> dict:
    with uds_client(daemon.home / "run" / f"{family}.sock", 10) as c:
        return c.get("/stats").json()


# Dense and MoE attention are what the rest of the suite serves, and Qwen3.5's MoE checkpoints
# have Qwen3.5's layers (run here) plus experts (Qwen3-Next's, run here): the long tier keeps
# them. Their engine tests (tests/integration/test_family_engine.py) run in `make test`.
SLOW = {"dense", "qwen3_moe", "qwen3_5_moe"}


CASES = [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in sorted(FAMILIES)]


@pytest.mark.parametrize("family", CASES)
def test_a_family_batches_caches_drains_restores_cancels_and_fits(daemon, reference, family):
    model, tok = reference(family)
    oai = daemon.openai()

    # Eight rows at once, prompts of 5 to 130 ids (past the 32-token windows).
    rng = random.Random(5)
    prompts = [[rng.randrange(10, 2000) for _ in range(n)] for n in (5, 9, 20, 33, 47, 64, 90, 130)]
    with ThreadPoolExecutor(8) as pool:
        got = list(
            pool.map(
                lambda p: oai.completions.create(
                    model=family, prompt=p, max_tokens=TOKENS, temperature=0
                ),
                prompts,
            )
        )
    for p, r in zip(prompts, got):
        assert r.choices[0].text == _greedy_text(model, tok, p), (family, len(p))

    # A conversation's second turn reuses the first (RAM), and answers as mlx-lm does. (The
    # assistant's turn is not the reply it generated: that one would travel as the generated
    # ids, cache/replies.py, and mlx-lm's reference would need them.)
    first = [{"role": "user", "content": LONG}]
    reply = _chat(oai, family, first).choices[0].message.content
    said = {"role": "assistant", "content": "Noted."}
    second = [*first, said, {"role": "user", "content": "Why?"}]
    warm = _chat(oai, family, second)
    ids = tok.apply_chat_template(second, add_generation_prompt=True)
    assert warm.choices[0].message.content == _greedy_text(model, tok, ids), family
    assert warm.usage.prompt_tokens_details.cached_tokens >= 0.8 * warm.usage.prompt_tokens

    # Unloaded (its cache drained to the SSD tier), reloaded: the same turn from the SSD.
    assert daemon.http.post(f"/admin/models/{family}/unload").is_success
    daemon.wait_for(lambda: daemon.status(family)["status"] == "available", 30, "unload")
    again = _chat(oai, family, second)
    assert again.choices[0].message.content == warm.choices[0].message.content, family
    assert again.usage.prompt_tokens_details.cached_tokens >= 0.8 * again.usage.prompt_tokens
    assert _worker_stats(daemon, family)["cache_ssd_hits"] == 1

    # A stream cut after its first chunks: the model goes on serving.
    stream = _chat(oai, family, [{"role": "user", "content": "Count on."}], stream=True)
    next(iter(stream))
    stream.close()
    assert _chat(oai, family, first).choices[0].message.content == reply

    # The fit report plans for it from its worker's own figures.
    fit = daemon.http.get("/admin/fit", params={"model": family})
    assert fit.status_code == 200, fit.text
    assert fit.json()["schemes"][0]["bytes_per_token"] > 0
    assert daemon.http.post(f"/admin/models/{family}/unload").is_success
