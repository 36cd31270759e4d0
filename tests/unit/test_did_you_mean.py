"""Unknown names get the closest known one: model ids on every surface, `default_model` at
start, config keys. One helper (shared/errors.py) makes every suggestion; no MLX here."""

import json
from types import SimpleNamespace

from mlxd.shared.config_load import load_settings
from mlxd.shared.errors import ModelNotFound, closest, did_you_mean, openai_body
from mlxd.supervisor.catalog import builtin
from mlxd.supervisor.catalog.catalog import Catalog
from mlxd.supervisor.catalog.discovery import default_model_problem

IDS = ["smollm2-135m-instruct", "mlx-community/Qwen3-0.6B-4bit", "tiny"]


def _model(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))


def _settings(tmp_path, config: str = "", models=("smollm2-135m-instruct", "tiny")):
    tmp_path.mkdir(exist_ok=True)
    for name in models:
        _model(tmp_path / "models" / name)
    (tmp_path / "config.toml").write_text(config)
    return load_settings({"home": str(tmp_path), "discover_hf_cache": False})


def test_closest_takes_case_then_spelling_then_the_shortest_holder():
    assert closest("TINY", IDS) == "tiny"
    assert closest("smollm2-135m-instruc", IDS) == "smollm2-135m-instruct"
    assert closest("smollm2", IDS) == "smollm2-135m-instruct"  # too short for difflib
    assert closest("qwen3", IDS) == "mlx-community/Qwen3-0.6B-4bit"
    assert closest("nope", IDS) is None
    assert closest("ny", ["tiny-chat-model"]) is None  # two letters are in too much
    assert did_you_mean("smollm2", IDS) == " (did you mean 'smollm2-135m-instruct'?)"
    assert did_you_mean("nope", IDS) == ""


def test_an_unknown_model_error_names_the_closest_id_in_the_envelope():
    err = ModelNotFound("smollm2", IDS)
    body = openai_body(err)["error"]
    assert body["message"] == (
        "The model 'smollm2' does not exist (did you mean 'smollm2-135m-instruct'?)"
    )
    assert (body["param"], body["code"], err.status) == ("model", "model_not_found", 404)
    assert ModelNotFound("nope", IDS).message == "The model 'nope' does not exist"


def test_catalog_resolve_suggests_ids_and_aliases(tmp_path):
    s = _settings(tmp_path, '[models.tiny]\naliases = ["little-one"]\n')
    catalog = Catalog(s)
    try:
        catalog.resolve("smollm2")
    except ModelNotFound as exc:
        assert "(did you mean 'smollm2-135m-instruct'?)" in exc.message
    else:
        raise AssertionError("an unknown id resolved")
    try:
        catalog.resolve("little-on")
    except ModelNotFound as exc:
        assert "(did you mean 'little-one'?)" in exc.message
    assert catalog.resolve("little-one").id == "tiny"


def test_default_model_must_name_a_model(tmp_path):
    s = _settings(tmp_path, 'default_model = "smollm2"\n')
    problem = default_model_problem(s)
    assert problem == (
        "default_model: no model is named 'smollm2' (did you mean "
        "'smollm2-135m-instruct'?); models found: smollm2-135m-instruct, tiny"
    )
    for good in ("tiny", "smollm2-135m-instruct"):
        s.default_model = good
        assert default_model_problem(s) is None
    s.default_model = None
    assert default_model_problem(s) is None  # none set: requests must name one


def test_default_model_may_be_an_alias_or_the_builtin_still_to_import(tmp_path):
    s = _settings(tmp_path, 'default_model = "small"\n[models.tiny]\naliases = ["small"]\n')
    assert default_model_problem(s) is None
    fresh = _settings(tmp_path / "fresh", 'default_model = "smollm2-135m-instruct"\n', models=())
    assert "no model is named 'smollm2-135m-instruct'" in default_model_problem(fresh)
    assert "models found: none" in default_model_problem(fresh)
    assert default_model_problem(fresh, importable=("smollm2-135m-instruct",)) is None


def test_a_section_marked_default_must_name_a_model(tmp_path):
    s = _settings(tmp_path, "[models.tinny]\ndefault = true\n")
    assert default_model_problem(s) == (
        "[models.\"tinny\"] default = true: no model is named 'tinny' (did you mean 'tiny'?); "
        "models found: smollm2-135m-instruct, tiny"
    )


def test_the_builtin_named_as_default_on_a_fresh_home_is_imported(monkeypatch, tmp_path):
    monkeypatch.setattr(builtin, "find_builtin_gguf", lambda: tmp_path / "m.gguf")
    s = _settings(tmp_path, 'default_model = "smollm2-135m-instruct"\n', models=())
    assert builtin.wants_builtin(SimpleNamespace(settings=s, entries=dict)) == "import"
    # once it is there, the user's choice is used as it is
    entries = {"smollm2-135m-instruct": object()}
    assert builtin.wants_builtin(SimpleNamespace(settings=s, entries=lambda: entries)) is None
