"""A model is loaded on one thread and served on another (the worker loads in a thread off its
event loop; the engine runs on its own). Arrays a model keeps outside its parameters (RoPE
tables, Gemma 4's) are lazy where they were made, and MLX 0.32 cannot evaluate them on another
thread's stream: the load evaluates them, so the first request is not a crash."""

from __future__ import annotations

import threading

import mlx.core as mx
from families import build_family_model
from mlx_lm.generate import generate_step

from mlxd.worker.model.load import load_model


def test_a_model_loaded_on_one_thread_generates_on_another(tmp_path):
    path = build_family_model(tmp_path / "gemma4", "gemma4")
    box = {}
    loader = threading.Thread(target=lambda: box.update(loaded=load_model(path, "g4")))
    loader.start()
    loader.join()
    model = box["loaded"].model
    results = []

    def serve():
        try:
            token, _ = next(generate_step(mx.array([11, 12, 13]), model, max_tokens=1))
            results.append(int(token))
        except RuntimeError as exc:  # "There is no Stream(cpu, 0) in current thread"
            results.append(exc)

    engine = threading.Thread(target=serve)
    engine.start()
    engine.join()
    assert len(results) == 1 and isinstance(results[0], int), results
