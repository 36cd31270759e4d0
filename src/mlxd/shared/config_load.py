"""How the settings are read and checked: flags over the environment over config.toml
(`load_settings`), unknown keys named with the closest valid one, pydantic errors as one line,
and the checks across model sections (aliases, chat_template files, draft models). What the
settings are is shared/config.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import tomllib
from pydantic import ValidationError
from pydantic_settings import PydanticBaseSettingsSource, SettingsError, TomlConfigSettingsSource

from mlxd.shared.adapters import ADAPTER_NAME, NAME_RULE
from mlxd.shared.config import ConfigError, ModelSettings, Settings, is_template_text
from mlxd.shared.errors import did_you_mean


def _check_model_sections(settings: Settings) -> None:
    """Aliases that name two models and chat_template files that are not there, as a
    ConfigError; a file's path is made absolute (relative: to the home)."""
    owner: dict[str, str] = {mid: mid for mid in settings.models}
    for mid, ms in settings.models.items():
        for alias in ms.aliases:
            other = owner.get(alias)
            if other is not None:
                what = "a model's id" if other == alias else f"an alias of '{other}'"
                raise ConfigError(f"model '{mid}': alias '{alias}' is already {what}")
            owner[alias] = mid
        if ms.chat_template is not None and not is_template_text(ms.chat_template):
            path = Path(ms.chat_template).expanduser()
            path = path if path.is_absolute() else settings.home_dir / path
            if not path.is_file():
                raise ConfigError(
                    f"model '{mid}': chat_template {path} is neither a file nor template text"
                )
            ms.chat_template = str(path)
        _resolve_draft(settings, mid, ms)
        _check_adapters(settings, mid, ms)


def _check_adapters(settings: Settings, mid: str, ms: ModelSettings) -> None:
    """`base` and `adapter_path` come together, name a model that is no adapter itself, and
    every adapter name is one a request can spell."""
    if (ms.base is None) != (ms.adapter_path is None):
        raise ConfigError(f"model '{mid}': base and adapter_path go together")
    names = [*ms.adapters, *([mid] if ms.base else [])]
    for name in names:
        if not ADAPTER_NAME.match(name):
            raise ConfigError(f"model '{mid}': adapter name {name!r} must be {NAME_RULE}")
    base = settings.models.get(ms.base) if ms.base else None
    if base is not None and base.base is not None:
        raise ConfigError(f"model '{mid}': its base '{ms.base}' is an adapter itself")


def _resolve_draft(settings: Settings, mid: str, ms: ModelSettings) -> None:
    """A "draft" model's `draft_model` as a folder's absolute path, else a ConfigError."""
    if ms.speculative != "draft":
        return
    if not ms.draft_model:
        raise ConfigError(f"model '{mid}': speculative = \"draft\" needs a draft_model")
    other = settings.models.get(ms.draft_model)
    path = other.path if other is not None and other.path else Path(ms.draft_model).expanduser()
    path = path if path.is_absolute() else settings.home_dir / "models" / path
    if not (path / "config.json").is_file():
        raise ConfigError(f"model '{mid}': draft_model {ms.draft_model!r} is not a model folder")
    ms.draft_model = str(path)


def load_settings(flags: dict[str, Any] | None = None, config: Path | None = None) -> Settings:
    """Build the settings: `flags` (only those given) over the environment over the TOML file.

    The TOML file is `config`, else $MLXD_HOME/config.toml, where the home itself comes from
    the flags or the environment first.
    """
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    home = Path(flags.get("home") or os.environ.get("MLXD_HOME") or "~/.mlxd").expanduser()
    toml = Path(config).expanduser() if config else home / "config.toml"
    if config and not toml.is_file():
        raise ConfigError(f"config file {toml} does not exist")
    if toml.is_file():
        check_config_keys(_read_toml(toml), toml)

    class _Layered(Settings):
        @classmethod
        def settings_customise_sources(cls, settings_cls, init_settings, env_settings, **_):
            sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
            if toml.is_file():
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml))
            return tuple(sources)

    try:
        settings = _Layered(**flags)
    except ValidationError as exc:
        raise ConfigError(f"invalid settings: {one_line(exc)}") from None
    except SettingsError as exc:  # an environment value that is not JSON where a list is due
        m = re.search(r'field "(\w+)"', str(exc))
        name = f"MLXD_{m.group(1).upper()}" if m else "an MLXD_* variable"
        raise ConfigError(
            f'invalid settings: {name} must be JSON for a list, e.g. {name}=\'["a", "b"]\''
        ) from None
    _check_model_sections(settings)
    return settings


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _unknown(keys: Any, valid: set[str]) -> list[str]:
    """'key' (did you mean 'closest'?) for each key not in `valid`."""
    return [f"'{key}'{did_you_mean(key, valid)}" for key in keys if key not in valid]


def check_config_keys(data: dict[str, Any], path: Path) -> None:
    """Raise ConfigError naming every key of the TOML file that no setting has: a typo would
    otherwise leave the setting at its default without a word."""
    problems = _unknown(data, set(Settings.model_fields))
    models = data.get("models")
    if isinstance(models, dict):
        for model_id, section in models.items():
            if isinstance(section, dict):
                where = f' in [models."{model_id}"]'
                problems += [p + where for p in _unknown(section, set(ModelSettings.model_fields))]
    if problems:
        plural = "s" if len(problems) > 1 else ""
        raise ConfigError(f"{path}: unknown key{plural} {', '.join(problems)}")


SECRET_HINTS = ("key", "token")


def one_line(exc: ValidationError) -> str:
    """A pydantic error as one line: `loc = value: reason` per error, joined by "; "."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        if any(h in loc for h in SECRET_HINTS) or isinstance(value, dict):
            parts.append(f"{loc}: {msg}")  # never echo a secret, nor a whole table
        else:
            shown = repr(value)
            parts.append(f"{loc} = {shown[:60] + '…' if len(shown) > 60 else shown}: {msg}")
    return "; ".join(parts)
