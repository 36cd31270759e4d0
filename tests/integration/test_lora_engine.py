"""Many LoRA adapters in one batch (worker/lora/): each row's greedy tokens are mlx-lm's own
generation with that row's adapter alone (mlx-lm's LoRALinear on a copy of the model), rows
without one are the base model's, and mounting or unmounting while rows run fails none."""

from __future__ import annotations

import random
import threading

import mlx.core as mx
import pytest
from lora_adapters import SHAPES, make_adapter, mlx_lm_model
from mlx_lm.generate import generate_step

from mlxd.shared.errors import MlxdError
from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.model.load import load_model

OUTPUT = 12


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    dest = tmp_path_factory.mktemp("adapters")
    return {name: make_adapter(tiny_model_dir, dest, name) for name in SHAPES}


class Row:
    def __init__(self, rid: str, prompt: list[int], adapter: str | None, eos_ids):
        self.events: list = []
        self.done = threading.Event()
        params = GenerationParams(
            max_tokens=OUTPUT,
            temperature=0.0,
            logprobs=True,
            logit_bias=dict.fromkeys(eos_ids, -1e4),
        )
        self.sub = Submission(rid, prompt, params, self._sink, adapter=adapter)

    def _sink(self, ev) -> None:
        self.events.append(ev)
        if ev.finish_reason is not None:
            self.done.set()

    @property
    def error(self):
        return next((ev.error for ev in self.events if ev.error is not None), None)

    @property
    def tokens(self) -> list[int]:
        return [lp["token_id"] for ev in self.events for lp in ev.logprobs or []]


class Sync:
    """An engine-thread job the test waits for (what EngineCall does for the event loop)."""

    def __init__(self, fn):
        self.fn, self.done, self.value, self.error = fn, threading.Event(), None, None

    def run(self, stream) -> None:
        try:
            with mx.stream(stream):
                self.value = self.fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test's thread
            self.error = exc
        self.done.set()

    def fail(self, err) -> None:
        self.error = err
        self.done.set()


def on_engine(engine: Engine, fn):
    job = Sync(fn)
    engine.run_job(job)
    assert job.done.wait(30)
    if job.error is not None:
        raise job.error
    return job.value


def prompts(n: int) -> list[list[int]]:
    rng = random.Random(n)
    return [[rng.randrange(10, 2000) for _ in range(rng.randrange(5, 40))] for _ in range(n)]


@pytest.fixture(params=[False, True], ids=["plain", "compiled"])
def engine(tiny_model_dir, request):
    """The engine with its decode forward plain, or compiled (the CPU's default: rows with
    adapters must take the plain forward, base-only batches may keep the trace)."""
    loaded = load_model(tiny_model_dir, "tiny")
    eng = Engine(loaded, batch=8, warmup=False, compile_decode=request.param)
    eng.start()
    yield eng
    eng.stop()
    assert eng.join(30)


def mount_all(engine: Engine, adapters: dict) -> None:
    assert engine.adapters is not None
    for name, path in adapters.items():
        on_engine(engine, lambda n=name, p=path: engine.adapters.mount(n, p))


def test_eight_rows_over_three_adapters_and_the_base_each_give_mlx_lms_tokens(
    engine, adapters, tiny_model_dir
):
    rows = run_mix(
        engine, adapters, tiny_model_dir, [None, "qv", "mlp", "all", "qv", None, "all", "mlp"]
    )
    # Each adapter changes what the model writes (B is not zero): the comparison has teeth.
    base = mlx_lm_model(tiny_model_dir, None)
    eos = engine.m.eos_ids
    assert all(r.tokens != oracle_tokens(base, r.sub.prompt, eos) for r in rows if r.sub.adapter)


def test_the_cuda_path_taking_each_rows_factors_gives_the_same_tokens(
    engine, adapters, tiny_model_dir, monkeypatch
):
    """CUDA takes each row's A and B before a batched matmul (gather_mm fails there): forced
    here, the same mix of rows gives mlx-lm's own tokens."""
    from mlxd.worker.lora import layer

    monkeypatch.setattr(layer, "TAKE_ROWS", True)
    calls = []
    real = mx.gather_mm
    monkeypatch.setattr(mx, "gather_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    run_mix(engine, adapters, tiny_model_dir, ["mlp", None, "qv", "all", "qv", "all"])
    assert not calls  # the path under test, not gather_mm


def run_mix(engine: Engine, adapters: dict, model_dir, names: list) -> list[Row]:
    """Rows over `names`' adapters (None: the base) at once; each gives mlx-lm's own tokens
    with its adapter alone."""
    mount_all(engine, adapters)
    eos = engine.m.eos_ids
    rows = [Row(f"r{i}", p, names[i], eos) for i, p in enumerate(prompts(len(names)))]
    for row in rows:
        engine.submit(row.sub)
    for row in rows:
        assert row.done.wait(60) and row.error is None
    models = {n: mlx_lm_model(model_dir, adapters.get(n)) for n in {*names}}
    for row in rows:
        want = oracle_tokens(models[row.sub.adapter], row.sub.prompt, eos)
        assert row.tokens == want, (row.sub.rid, row.sub.adapter)
    return rows


def oracle_tokens(model, prompt: list[int], eos_ids) -> list[int]:
    from mlx_lm.sample_utils import make_logits_processors

    procs = make_logits_processors(logit_bias=dict.fromkeys(eos_ids, -1e4))
    out = generate_step(mx.array(prompt), model, max_tokens=OUTPUT, logits_processors=procs)
    return [int(t) for t, _ in out]


def test_a_lone_adapter_row_gives_mlx_lms_tokens_and_unknown_names_fail_alone(
    engine, adapters, tiny_model_dir
):
    mount_all(engine, {"all": adapters["all"]})
    eos = engine.m.eos_ids
    prompt = prompts(1)[0]
    row, ghost = Row("lone", prompt, "all", eos), Row("ghost", prompt, "nope", eos)
    engine.submit(ghost.sub)
    engine.submit(row.sub)
    assert row.done.wait(60) and ghost.done.wait(60)
    assert row.error is None
    assert row.tokens == oracle_tokens(mlx_lm_model(tiny_model_dir, adapters["all"]), prompt, eos)
    assert ghost.error is not None and ghost.error.status == 404


def test_mount_and_unmount_while_rows_run_fail_no_row(engine, adapters, tiny_model_dir):
    mount_all(engine, {"qv": adapters["qv"]})
    eos = engine.m.eos_ids
    ps = prompts(6)
    first = [Row(f"a{i}", p, ["qv", None][i % 2], eos) for i, p in enumerate(ps[:3])]
    for row in first:
        engine.submit(row.sub)
    on_engine(engine, lambda: engine.adapters.mount("mlp", adapters["mlp"]))
    later = [Row(f"b{i}", p, "mlp", eos) for i, p in enumerate(ps[3:])]
    for row in later:
        engine.submit(row.sub)
    on_engine(engine, lambda: engine.adapters.unmount("qv"))  # its rows finish on it
    for row in first + later:
        assert row.done.wait(60) and row.error is None, row.sub.rid
    models = {n: mlx_lm_model(tiny_model_dir, adapters.get(n)) for n in (None, "qv", "mlp")}
    for row in first + later:
        assert row.tokens == oracle_tokens(models[row.sub.adapter], row.sub.prompt, eos)
    assert [m["name"] for m in engine.adapters.info()] == ["mlp"]


def test_a_bad_adapter_is_a_clear_error_and_the_engine_serves_on(engine, adapters, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(adapters["qv"], bad)
    cfg = bad / "adapter_config.json"
    arrays = mx.load(str(bad / "adapters.safetensors"))
    key = next(k for k in arrays if k.endswith("lora_b"))
    arrays[key] = mx.zeros((arrays[key].shape[0], 7))  # the wrong output width
    mx.save_safetensors(str(bad / "adapters.safetensors"), arrays)
    with pytest.raises(MlxdError) as err:
        on_engine(engine, lambda: engine.adapters.mount("bad", bad))
    assert err.value.status == 400 and "lora_b" in err.value.message
    with pytest.raises(MlxdError) as err:
        on_engine(engine, lambda: engine.adapters.mount("gone", tmp_path / "nothing"))
    assert err.value.status == 404
    cfg.write_text('{"fine_tune_type": "dora", "lora_parameters": {"scale": 1}}')
    with pytest.raises(MlxdError) as err:
        on_engine(engine, lambda: engine.adapters.mount("dora", bad))
    assert err.value.status == 400 and "dora" in err.value.message
    # Found by a black-box probe (2026-12-07): the first three were 500s quoting Python's
    # error, and a NaN scale was mounted and wrote NaN logits.
    for text, word in [
        ("[1, 2]", "object"),
        ('"lora"', "object"),
        ('{"lora_parameters": [1]}', "scale"),
        ('{"lora_parameters": {"scale": "big"}}', "finite"),
        ('{"lora_parameters": {"scale": NaN}}', "finite"),
        ('{"lora_parameters": {"scale": true}}', "finite"),
    ]:
        cfg.write_text(text)
        with pytest.raises(MlxdError) as err:
            on_engine(engine, lambda: engine.adapters.mount("odd", bad))
        assert err.value.status == 400 and word in err.value.message, text
    row = Row("after", prompts(1)[0], None, engine.m.eos_ids)
    engine.submit(row.sub)
    assert row.done.wait(60) and row.error is None and len(row.tokens) == OUTPUT


def test_an_adapter_changed_on_disk_since_its_mount_is_refused_when_it_loads_again(
    engine, adapters, tmp_path
):
    """An evicted adapter loads again from its folder; weights other than the mounted ones
    would run under the mounted weights' cache namespace, so its rows get a 409 until it is
    mounted again."""
    import shutil

    a = engine.adapters
    src = tmp_path / "x"
    shutil.copytree(adapters["qv"], src)
    on_engine(engine, lambda: a.mount("x", src))
    a.cap_bytes = a.mounted["x"].nbytes  # room for one adapter: the next mount evicts x
    on_engine(engine, lambda: a.mount("y", adapters["qv"]))
    assert {m["name"]: m["loaded"] for m in a.info()} == {"x": False, "y": True}
    for f in ("adapters.safetensors", "adapter_config.json"):
        shutil.copy(adapters["all"] / f, src / f)
    eos = engine.m.eos_ids
    row = Row("changed", prompts(1)[0], "x", eos)
    engine.submit(row.sub)
    assert row.done.wait(60) and row.error is not None
    assert row.error.status == 409 and "mount it again" in row.error.message
    assert str(tmp_path) not in row.error.message
    a.cap_bytes = 1 << 30
    on_engine(engine, lambda: a.mount("x", src))  # mounted again: its new weights serve
    again = Row("again", prompts(1)[0], "x", eos)
    engine.submit(again.sub)
    assert again.done.wait(60) and again.error is None and len(again.tokens) == OUTPUT
