"""Find servable model folders: $MLXD_HOME/models, the Hugging Face cache, and config.

An id is only ever looked up in what discovery found: no path is built from a request string.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlxd.shared.config import ModelSettings, Settings
from mlxd.shared.errors import did_you_mean


@dataclass(frozen=True)
class ModelEntry:
    """A model mlxd can serve."""

    id: str
    path: Path
    source: str  # "home", "hf-cache" or "config"
    weights_bytes: int


def weights_bytes(path: Path) -> int:
    """Bytes of the folder's weight files (safetensors; symlinks followed as the HF cache uses)."""
    total = 0
    for f in path.glob("*.safetensors"):
        try:
            total += f.stat().st_size
        except OSError:
            pass
    return total


def draft_weights_bytes(ms: ModelSettings) -> int:
    """Bytes of a model's draft model (speculative = "draft"), loaded beside it in its worker."""
    if ms.speculative != "draft" or not ms.draft_model:
        return 0
    return weights_bytes(Path(ms.draft_model))


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def scan_home(models_dir: Path) -> list[ModelEntry]:
    """models/<id>/ and models/<org>/<name>/ (id "org/name")."""
    found: list[ModelEntry] = []
    if not models_dir.is_dir():
        return found
    for d in sorted(models_dir.iterdir()):
        if d.name.startswith(".") or not d.is_dir():
            continue  # dot-folders are imports or downloads in progress
        if _is_model_dir(d):
            found.append(ModelEntry(d.name, d, "home", weights_bytes(d)))
            continue
        for sub in sorted(d.iterdir()):
            if not sub.name.startswith(".") and sub.is_dir() and _is_model_dir(sub):
                found.append(ModelEntry(f"{d.name}/{sub.name}", sub, "home", weights_bytes(sub)))
    return found


def scan_hf_cache(cache: Path) -> list[ModelEntry]:
    """models--org--name/snapshots/<rev>/ → id "org/name" (refs/main, else the newest)."""
    found: list[ModelEntry] = []
    if not cache.is_dir():
        return found
    for repo in sorted(cache.glob("models--*")):
        parts = repo.name.split("--")[1:]
        if not parts:
            continue
        snapshot = _snapshot(repo)
        if snapshot is not None and _is_model_dir(snapshot):
            found.append(ModelEntry("/".join(parts), snapshot, "hf-cache", weights_bytes(snapshot)))
    return found


def _snapshot(repo: Path) -> Path | None:
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = [s for s in (repo / "snapshots").glob("*") if s.is_dir()]
    return max(snaps, key=lambda s: s.stat().st_mtime) if snaps else None


def discover(settings: Settings, hf_cache: Path | None = None) -> dict[str, ModelEntry]:
    """Every model by id. Config entries win over home folders, which win over the HF cache
    (`hf_cache`, else settings.hf_cache_dir)."""
    entries: dict[str, ModelEntry] = {}
    if settings.discover_hf_cache:
        for e in scan_hf_cache(hf_cache or settings.hf_cache_dir.expanduser()):
            entries[e.id] = e
    for e in scan_home(settings.models_dir):
        entries[e.id] = e
    for model_id, ms in settings.models.items():
        if ms.path is not None:
            path = ms.path.expanduser()
            entries[model_id] = ModelEntry(model_id, path, "config", weights_bytes(path))
    return entries


def config_path_problem(settings: Settings) -> str | None:
    """The first `[models."<id>"]` whose `path` is not a model folder, in one line (None: all
    are). Checked at start: such a model would otherwise be listed as 0 B and fail on use."""
    for model_id, ms in settings.models.items():
        if ms.path is None:
            continue
        path = ms.path.expanduser()
        if not path.exists():
            return f"model '{model_id}': path {path} does not exist"
        if not _is_model_dir(path):
            return f"model '{model_id}': {path} is not a model folder (it has no config.json)"
    return None


def alias_problem(settings: Settings) -> str | None:
    """The first configured alias that is also the id of a model discovery finds, in one line
    (None: none is). Clashes among configured ids and aliases are load_settings' to refuse."""
    ids = discover(settings)
    for alias, model_id in settings.alias_map().items():
        if alias in ids:
            return f"model '{model_id}': alias '{alias}' is already a model's id"
    return None


def default_model_problem(settings: Settings, importable: tuple[str, ...] = ()) -> str | None:
    """`default_model` (or a `[models."<id>"]` marked `default`) that names no model, in one
    line (None: it names one, or none is set). `importable` ids pass too: the built-in model
    is imported after the start that makes it the default."""
    names = [*discover(settings), *settings.alias_map()]
    if settings.default_model:
        wanted, what = settings.default_model, "default_model"
    else:
        marked = [mid for mid, ms in settings.models.items() if ms.default]
        if not marked:
            return None
        wanted, what = marked[0], f'[models."{marked[0]}"] default = true'
    if wanted in names or wanted in importable:
        return None
    hint = did_you_mean(wanted, [*names, *importable])
    shown = sorted(names)[:5]
    known = ", ".join(shown) + (", …" if len(names) > len(shown) else "") if names else "none"
    return f"{what}: no model is named '{wanted}'{hint}; models found: {known}"
