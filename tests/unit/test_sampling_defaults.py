"""A model's request defaults, resolved once for the worker and for /admin/models/{id} (the
dashboard's playground starts from them)."""

from __future__ import annotations

import json

from mlxd.shared.sampling import SamplingDefaults, read_defaults, resolve_defaults
from mlxd.supervisor.ctl.tables import show_text


def test_section_over_generation_config_over_built_ins(tmp_path):
    assert read_defaults(tmp_path) == SamplingDefaults()  # no file: the built-in values
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"do_sample": False, "top_p": 0.8, "top_k": 20, "min_p": True})
    )
    d = read_defaults(tmp_path)
    assert d.sampling == {"temperature": 0.0, "top_p": 0.8, "top_k": 20, "min_p": 0.0}  # greedy
    r = resolve_defaults(tmp_path, {"top_p": 0.5, "system": "Be terse.", "max_tokens": None})
    flat = r.flat()
    assert (flat["temperature"], flat["top_p"], flat["top_k"], r.system, r.max_tokens) == (
        0.0,
        0.5,
        20,
        "Be terse.",
        None,
    )
    assert resolve_defaults(tmp_path, {"chat_template": "x"}) == d  # not a sampling default


def test_a_broken_generation_config_gives_the_built_in_values(tmp_path):
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    assert read_defaults(tmp_path) == SamplingDefaults()


def test_mlxctl_show_lists_the_request_defaults():
    body = {
        "id": "m",
        "state": "stopped",
        "drained": False,
        "pid": None,
        "source": "home",
        "path": "/m",
        "weights_bytes": 1 << 20,
        "last_error": None,
        "sampling_defaults": {"temperature": 0.0, "max_tokens": None},
    }
    text = show_text(body)
    assert "request defaults\n  temperature            0.0\n  max_tokens             -" in text
