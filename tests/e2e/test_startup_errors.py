"""Every reason `mlxd start` refuses to start: one line on stderr, exit status 2, nothing left
running and no URL file written."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from procs import free_port

# (config.toml text, extra args, extra environment, what the one line must say)
CASES = {
    "unknown top-level key": (
        "keep_alive = 60\n",
        [],
        {},
        ["unknown key 'keep_alive' (did you mean 'keep_alive_s'?)", "config.toml"],
    ),
    "unknown model key": (
        '[models."org/m"]\npinned = true\nbatchh = 2\n',
        [],
        {},
        ["unknown key 'batchh' (did you mean 'batch'?) in [models.\"org/m\"]"],
    ),
    "missing --config file": (
        "",
        ["--config", "{home}/nope.toml"],
        {},
        ["nope.toml does not exist"],
    ),
    "TOML syntax": ("keep_alive_s = \n", [], {}, ["cannot read", "config.toml"]),
    "invalid value in the file": (
        "batch = 0\n",
        [],
        {},
        ["batch = 0: Input should be greater than or equal to 1"],
    ),
    "invalid value in the environment": (
        "",
        [],
        {"MLXD_KEEP_ALIVE_S": "soon"},
        ["keep_alive_s = 'soon'", "valid number"],
    ),
    "a list in the environment that is not JSON": (
        "",
        [],
        {"MLXD_ALLOWED_HOSTS": "llm.internal"},
        ["MLXD_ALLOWED_HOSTS must be JSON for a list"],
    ),
    "bad --log-level": ("", ["--log-level", "loud"], {}, ["log_level = 'loud'", "DEBUG, INFO"]),
    "model path does not exist": (
        '[models.mine]\npath = "{home}/gone"\n',
        [],
        {},
        ["model 'mine': path {home}/gone does not exist"],
    ),
    "model path is not a model folder": (
        '[models.mine]\npath = "{home}"\n',
        [],
        {},
        ["model 'mine': {home} is not a model folder"],
    ),
    "alias taken by another model": (
        '[models.x]\naliases = ["y"]\n[models.z]\naliases = ["y"]\n',
        [],
        {},
        ["model 'z': alias 'y' is already an alias of 'x'"],
    ),
    "alias that is a model's id": (
        '[models.x]\naliases = ["z"]\n[models.z]\npinned = true\n',
        [],
        {},
        ["model 'x': alias 'z' is already a model's id"],
    ),
    "chat_template file missing": (
        '[models.x]\nchat_template = "templates/x.jinja"\n',
        [],
        {},
        ["model 'x': chat_template {home}/templates/x.jinja is neither a file nor template"],
    ),
    "speculation beside a quantized KV cache": (
        '[models.x]\nkv_bits = 8\nspeculative = "ngram"\n',
        [],
        {},
        ["models.x: speculative decoding runs on the float KV cache"],
    ),
    "speculation in a worker group": (
        '[models.x]\ngroup_size = 2\nspeculative = "ngram"\n',
        [],
        {},
        ["models.x: a worker group does not speculate"],
    ),
    "a group host that would be an ssh option": (
        '[models.x]\nhosts = ["127.0.0.1", "-oProxyCommand=x"]\n',
        [],
        {},
        ["'-oProxyCommand=x' is not an IP address"],
    ),
    "default_model that names no model": (
        'default_model = "smollm2"\n',
        [],
        {},
        ["default_model: no model is named 'smollm2'", "models found: none"],
    ),
    "bad flag": ("", ["--port", "eighty"], {}, ["argument --port: invalid int value: 'eighty'"]),
    "port in use": ("", [], {}, ["cannot listen on 127.0.0.1:{port}: Address already in use"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_startup_error_is_one_line_and_exit_2(case, tmp_path):
    config, args, env, expected = CASES[case]
    home = str(tmp_path)
    (tmp_path / "config.toml").write_text(config.format(home=home))
    with socket.socket() as busy:
        if case == "port in use":
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
        else:
            port = free_port()
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlxd.supervisor",
                "start",
                "--home",
                home,
                "--port",
                str(port),
                *(a.format(home=home) for a in args),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "MLXD_DISCOVER_HF_CACHE": "false", **env},
        )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("mlxd"), lines[0]
    for part in expected:
        assert part.format(home=home, port=port) in lines[0], lines[0]
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert not (tmp_path / "run" / "mlxd.url").exists()
