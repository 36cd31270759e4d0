"""The launch contract: settings resolved once, a WorkerSpec on the command line, parsed back."""

from pathlib import Path

import pytest

from mlxd.shared.config import MODEL_FALLBACKS, Settings
from mlxd.shared.config_load import load_settings
from mlxd.shared.worker_spec import SAME_AS_SETTINGS, WorkerSpec
from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.lifecycle.launch import worker_argv, worker_spec
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.worker.config import parse_args

CONFIG = """
keep_alive_s = 42
batch = 6
kv_allowance_bytes = 1234
log_level = "debug"
prompt_cache_bytes = 0
grammar_max_repeat = 77
stream_heartbeat_s = 3.5
drain_timeout_s = 9
image_urls = true
image_url_private = true
image_max_bytes = "5MiB"
api_key = "sk-very-secret-key"
admin_token = "admin-very-secret-token"
[models."org/tuned"]
batch = 2
context_limit = 4096
keep_alive_s = -1
kv_allowance_bytes = 0
enable_thinking = false
[models.plain]
pinned = true
"""


@pytest.fixture
def settings(tmp_path) -> Settings:
    (tmp_path / "config.toml").write_text(CONFIG)
    return load_settings({"home": str(tmp_path)})


def slot_for(settings: Settings, model_id: str, generation: int = 0) -> ModelSlot:
    entry = ModelEntry(model_id, Path("/models") / model_id, "config", 100)
    sock = settings.run_dir / f"{model_id.replace('/', '-')}.sock"
    return ModelSlot(
        entry=entry,
        settings=settings.for_model(model_id),
        socket=sock,
        estimate_bytes=100,
        generation=generation,
    )


def test_per_model_fallbacks_are_resolved_once(settings):
    tuned, plain, unknown = (settings.for_model(m) for m in ("org/tuned", "plain", "nope"))
    assert (tuned.batch, tuned.context_limit, tuned.keep_alive_s) == (2, 4096, -1)
    assert tuned.kv_allowance_bytes == 0  # 0 is a value, not "unset"
    assert tuned.enable_thinking is False
    for ms in (plain, unknown):
        assert (ms.batch, ms.keep_alive_s, ms.kv_allowance_bytes) == (6, 42, 1234)
        assert ms.context_limit is None  # neither says: the model's own
        assert ms.enable_thinking is None  # the template's default
    assert plain.pinned and not unknown.pinned
    assert all(getattr(unknown, f) == getattr(settings, f) for f in MODEL_FALLBACKS)
    # The raw section keeps what the file said (for_model hands out a resolved copy).
    assert settings.models["plain"].batch is None


def test_spec_from_resolved_settings(settings):
    spec = worker_spec(settings, slot_for(settings, "org/tuned", generation=3))
    assert (spec.model_id, spec.model_path) == ("org/tuned", Path("/models/org/tuned"))
    assert (spec.batch, spec.context_limit, spec.enable_thinking) == (2, 4096, False)
    assert spec.generation == 3 and spec.socket.parent == settings.run_dir
    assert (spec.log_level, spec.prompt_cache_bytes, spec.grace_s) == ("DEBUG", 0, 9.0)
    assert (spec.grammar_max_repeat, spec.stream_heartbeat_s) == (77, 3.5)
    limits = spec.image_limits  # what the worker checks a request's images against
    assert (limits.fetch_urls, limits.max_bytes, limits.max_count) == (True, 5 * 1024**2, 16)
    assert limits.url_private
    assert spec.ssd_cache_dir == settings.cache_dir
    plain = worker_spec(settings, slot_for(settings, "plain"))
    assert (plain.batch, plain.context_limit, plain.enable_thinking) == (6, None, None)
    off = settings.model_copy(update={"ssd_cache": False})
    assert worker_spec(off, slot_for(off, "plain")).ssd_cache_dir is None


def test_argv_round_trip_gives_the_same_spec(settings):
    for model_id in ("org/tuned", "plain"):
        slot = slot_for(settings, model_id, generation=1)
        argv = worker_argv(settings, slot)
        assert parse_args(argv, log_level="ERROR") == worker_spec(settings, slot)
        assert WorkerSpec.from_argv(["python", "-m", "mlxd.worker", *argv]).model_id == model_id


def test_no_secret_reaches_the_command_line(settings):
    text = " ".join(worker_argv(settings, slot_for(settings, "org/tuned")))
    assert "sk-very-secret-key" not in text and "admin-very-secret-token" not in text
    assert not {"api_key", "admin_token"} & set(WorkerSpec.model_fields)


def test_copied_settings_share_names_and_defaults():
    for name in SAME_AS_SETTINGS:
        assert Settings.model_fields[name].default == WorkerSpec.model_fields[name].default, name


def test_standalone_flags_build_the_same_spec(tmp_path):
    base = ["--model-path", str(tmp_path), "--model-id", "m", "--socket", str(tmp_path / "s")]
    spec = parse_args(base)
    want = WorkerSpec(
        model_path=tmp_path,
        model_id="m",
        socket=tmp_path / "s",
        ssd_cache_dir=Path("~/.mlxd/cache").expanduser(),  # the standalone default
    )
    assert spec == want
    full = parse_args(
        [
            *base,
            "--batch",
            "3",
            "--context-limit",
            "256",
            "--no-ssd-cache",
            "--no-exit-with-parent",
            "--no-enable-thinking",
            "--grace-s",
            "0.5",
            "--generation",
            "2",
            "--grammar-cache-bytes",
            "99",
            "--log-level",
            "warning",
        ],
        log_level="DEBUG",
    )
    assert full == want.model_copy(
        update={
            "batch": 3,
            "context_limit": 256,
            "ssd_cache_dir": None,
            "exit_with_parent": False,
            "enable_thinking": False,
            "grace_s": 0.5,
            "generation": 2,
            "grammar_cache_bytes": 99,
            "log_level": "WARNING",
        }
    )
    assert parse_args(base, log_level="debug").log_level == "DEBUG"  # $MLXD_LOG_LEVEL


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--spec", "{not json"], "invalid --spec"),
        (["--spec", '{"model_id": "m"}'], "invalid --spec"),
        (["--spec", '{"model_path": "p", "model_id": "m", "socket": "s", "x": 1}'], "--spec"),
        (["--spec", "{}", "--batch", "2"], "unrecognized arguments"),
        (["--model-path", "p", "--model-id", "m", "--socket", "s", "--batch", "0"], "--batch"),
        (["--model-path", "p", "--socket", "s"], "--model-id"),
    ],
)
def test_usage_errors_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--speculative", "draft"], 'speculative "draft" needs a draft model'),
        (["--speculative", "ngram", "--kv-bits", "8"], "runs on the float KV cache"),
    ],
)
def test_speculation_that_could_never_run_is_a_usage_error(tmp_path, capsys, flags, says):
    base = ["--model-path", str(tmp_path), "--model-id", "m", "--socket", str(tmp_path / "s")]
    with pytest.raises(SystemExit) as exc:
        parse_args([*base, *flags])
    assert exc.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("name", ["strip_attribution_lines", "attention_buckets"])
def test_switches_on_by_default_and_off_reach_the_worker(tmp_path, monkeypatch, name):
    on = load_settings({"home": str(tmp_path)})
    monkeypatch.setenv("MLXD_" + name.upper(), "false")
    off = load_settings({"home": str(tmp_path)})
    for settings, want in ((on, True), (off, False)):
        argv = worker_argv(settings, slot_for(settings, "m"))
        assert getattr(parse_args(argv), name) is want
    base = ["--model-path", str(tmp_path), "--model-id", "m", "--socket", str(tmp_path / "s")]
    assert getattr(parse_args(base), name) is True
    flag = "--no-" + name.replace("_", "-")
    assert getattr(parse_args([*base, flag]), name) is False
