"""mlxctl's choice of daemon where no daemon is needed: the default, wildcard binds, bad ports."""

import pytest

from mlxd.supervisor.ctl.client import CtlError
from mlxd.supervisor.ctl.target import Target, resolve


def test_defaults_and_wildcard_binds(tmp_path):
    assert resolve(None, {}, tmp_path) == Target("http://127.0.0.1:8080", "the default")
    (tmp_path / "config.toml").write_text('host = "0.0.0.0"\nport = 9001\n')
    assert resolve(None, {}, tmp_path).url == "http://127.0.0.1:9001"
    assert resolve(None, {"MLXD_HOST": "::"}, tmp_path).url == "http://[::1]:9001"
    assert resolve(None, {"MLXD_PORT": "9002"}, tmp_path).url == "http://127.0.0.1:9002"
    (tmp_path / "config.toml").write_text("port = [")  # the daemon would refuse it: ignored
    assert resolve(None, {}, tmp_path).source == "the default"
    with pytest.raises(CtlError, match=r"\$MLXD_PORT is '99999', not a port number"):
        resolve(None, {"MLXD_PORT": "99999"}, tmp_path)
