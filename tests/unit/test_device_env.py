"""The worker's MLX settings: mlxd's CUDA graph limits unless the user set their own."""

from mlxd.worker.device_env import DEVICE_ENV, apply_device_env


def test_unset_limits_get_mlxd_defaults_and_a_users_value_is_kept():
    env = {"MLX_MAX_OPS_PER_BUFFER": "40"}
    apply_device_env(env)
    assert env["MLX_MAX_OPS_PER_BUFFER"] == "40"
    assert env["MLX_MAX_MB_PER_BUFFER"] == DEVICE_ENV["MLX_MAX_MB_PER_BUFFER"]


def test_macos_keeps_metals_own_limits():
    env: dict[str, str] = {}
    apply_device_env(env, platform="darwin")
    assert env == {}
