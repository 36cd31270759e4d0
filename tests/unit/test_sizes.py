"""Sizes with units: settings, environment and flags take them; everything printed has them."""

from __future__ import annotations

import pytest

from mlxd.shared.config import ConfigError
from mlxd.shared.config_load import load_settings
from mlxd.shared.sizes import format_size, parse_size
from mlxd.supervisor.policy.eviction import DoesNotFit, Resident, plan_eviction
from mlxd.worker.config import parse_args

MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize(
    ("text", "n"),
    [
        (1073741824, GiB),
        ("1073741824", GiB),
        ("1GiB", GiB),
        ("1 gib", GiB),
        ("512MB", 512_000_000),
        ("512MiB", 512 * MiB),
        ("1.5GiB", 3 * GiB // 2),
        ("2k", 2000),
        ("10 KiB", 10240),
        ("7B", 7),
    ],
)
def test_sizes_parse_with_and_without_units(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "GiB", "1 bananas", "1e9", "-1GiB", "1 G iB", None])
def test_a_bad_size_says_how_to_write_one(bad):
    with pytest.raises(ValueError, match="is not a size: give bytes"):
        parse_size(bad)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (1280, "1.3 KiB"),  # 1.25: ties round up, as the dashboard's toFixed does
        (116 * MiB + MiB // 2, "117 MiB"),
        (606 * MiB + 12345, "606 MiB"),
        (GiB, "1 GiB"),
        (GiB - MiB // 3, "1 GiB"),  # 1023.7 MiB
        (20 * GiB, "20 GiB"),
        (None, None),
    ],
)
def test_sizes_print_with_units(n, text):
    assert format_size(n) == text


def test_the_config_file_and_the_environment_take_sizes_with_units(tmp_path, monkeypatch):
    (tmp_path / "config.toml").write_text(
        'memory_budget_bytes = "1GiB"\nprompt_cache_bytes = 1048576\n'
        '[models.a]\nkv_allowance_bytes = "64 MiB"\n'
    )
    monkeypatch.setenv("MLXD_SSD_CACHE_BYTES", "2GB")
    s = load_settings({"home": str(tmp_path)})
    assert s.memory_budget_bytes == GiB
    assert s.prompt_cache_bytes == MiB  # a plain integer is still bytes
    assert s.ssd_cache_bytes == 2_000_000_000
    assert s.for_model("a").kv_allowance_bytes == 64 * MiB


def test_a_bad_size_in_the_config_is_one_line_naming_the_key(tmp_path):
    (tmp_path / "config.toml").write_text('memory_budget_bytes = "1 gigabyte"\n')
    with pytest.raises(ConfigError) as exc:
        load_settings({"home": str(tmp_path)})
    msg = str(exc.value)
    assert "memory_budget_bytes" in msg and "is not a size" in msg and "\n" not in msg


def test_worker_flags_take_sizes_with_units(capsys):
    base = ["--model-path", "/m", "--model-id", "m", "--socket", "/s"]
    spec = parse_args([*base, "--prompt-cache-bytes", "64MiB", "--grammar-cache-bytes", "1MB"])
    assert spec.prompt_cache_bytes == 64 * MiB and spec.grammar_cache_bytes == 1_000_000
    with pytest.raises(SystemExit) as exc:
        parse_args([*base, "--kv-budget-bytes", "lots"])
    assert exc.value.code == 2
    assert "--kv-budget-bytes: 'lots' is not a size" in capsys.readouterr().err


def test_a_model_that_cannot_fit_says_so_in_units():
    pinned = Resident("p", 512 * MiB, 0, 0.0, pinned=True)
    with pytest.raises(DoesNotFit) as exc:
        plan_eviction([pinned], 606 * MiB, GiB, 0)
    assert str(exc.value) == (
        "needs 606 MiB, 512 MiB free of a 1 GiB budget (512 MiB held by pinned models)"
    )


@pytest.mark.parametrize("absurd", ["99999999999TiB", 1 << 61, "2000000TB"])
def test_a_size_no_machine_holds_is_refused(absurd):
    with pytest.raises(ValueError, match="more than any machine holds"):
        parse_size(absurd)


def test_an_absurd_size_in_the_environment_is_one_line_at_start(tmp_path, monkeypatch):
    from mlxd.shared.config import ConfigError
    from mlxd.shared.config_load import load_settings

    monkeypatch.setenv("MLXD_KV_BUDGET_BYTES", "99999999999TiB")
    with pytest.raises(ConfigError) as info:
        load_settings({"home": str(tmp_path)})
    assert "kv_budget_bytes" in str(info.value) and "\n" not in str(info.value)
