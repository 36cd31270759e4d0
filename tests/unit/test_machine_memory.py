"""What the supervisor plans in on a CUDA card: the card's memory, read from nvidia-smi where
MLX's CUDA backend is installed (supervisor/machine.py), is the budget's ceiling."""

from __future__ import annotations

import subprocess

from fake_workers import Fleet, make_models, settings_for

from mlxd.supervisor.machine import card_bytes, cuda_card_bytes
from mlxd.supervisor.registry.registry import Registry

GiB = 1024**3
H100_AND_L4 = "81559\n23034\n"  # nvidia-smi --query-gpu=memory.total (MiB), a card a line


def answer(text: str):
    def query(args):
        assert "--query-gpu=memory.total" in args
        return text

    return query


def test_the_card_mlx_runs_on_is_the_first_visible_one():
    assert card_bytes(answer(H100_AND_L4), visible="") == 81559 * 1024**2
    assert card_bytes(answer(H100_AND_L4), visible="1,0") == 23034 * 1024**2
    assert card_bytes(answer(H100_AND_L4), visible="GPU-5b1c") == 81559 * 1024**2  # a UUID


def test_an_unreadable_answer_plans_in_ram():
    def fails(args):
        raise subprocess.CalledProcessError(9, "nvidia-smi")

    def missing(args):
        raise FileNotFoundError("nvidia-smi")

    assert card_bytes(fails, visible="") is None
    assert card_bytes(missing, visible="") is None
    assert card_bytes(answer("N/A\n"), visible="") is None
    assert card_bytes(answer(H100_AND_L4), visible="7") is None  # no such card


def test_without_mlxs_cuda_backend_no_card_is_asked():
    assert cuda_card_bytes(on_cuda=lambda: False) is None


def build(tmp_path, card, **overrides) -> Registry:
    if not (tmp_path / "models").exists():
        make_models(tmp_path, "a")
    settings = settings_for(tmp_path, **overrides)
    fleet = Fleet()
    return Registry.build(
        settings, fleet, total_memory_bytes=126 * GiB, card_bytes=card, spawner=fleet.spawner
    )


def test_a_card_smaller_than_three_quarters_of_ram_is_the_budget(tmp_path):
    # 75% of a 126 GiB host is 94.5 GiB; the 80 GB card holds 79.6 GiB of it.
    reg = build(tmp_path, 81559 * 1024**2)
    assert reg.lifecycle.budget_bytes == 81559 * 1024**2
    assert reg.machine_bytes == 81559 * 1024**2  # what `mlxctl fit` plans a worker in


def test_a_card_larger_than_the_ram_share_leaves_the_share(tmp_path):
    reg = build(tmp_path, 141 * GiB)
    assert reg.lifecycle.budget_bytes == int(126 * GiB * 0.75)


def test_no_card_and_an_explicit_budget_are_as_before(tmp_path):
    assert build(tmp_path, None).lifecycle.budget_bytes == int(126 * GiB * 0.75)
    assert build(tmp_path, None).machine_bytes == 126 * GiB
    assert build(tmp_path, 8 * GiB, memory_budget_bytes=20 * GiB).lifecycle.budget_bytes == 20 * GiB
