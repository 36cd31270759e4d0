"""transformers' lazy-import table kept on disk between worker starts.

mlx-lm imports transformers (its tokenizers), and transformers 5 builds its lazy-import table
at every `import transformers` by reading each of its ~3,400 model source files for their
`__all__` (`transformers.utils.import_utils.define_import_structure`): 0.9 s of a worker's
2.7 s of imports on a 2-core Linux machine, paid again at every load, reload and restart. The
table depends on the installed transformers files only, so the first worker computes it and
later ones read it back from `<cache>/mlxd/transformers-imports-<key>.json`, the key naming
transformers' own files (its location, its `__init__.py`'s size and time, the models folder's).

`install()` puts a finder on `sys.meta_path` for that one module, before anything imports
transformers; the finder hands the module back with `define_import_structure` wrapped. Anything
unexpected (another transformers layout, an unreadable or damaged file, a table that does not
round-trip) leaves transformers to do what it does without us.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
from pathlib import Path

MODULE = "transformers.utils.import_utils"


def cache_dir(env: os._Environ | dict = os.environ) -> Path:
    """Where the tables go: `$XDG_CACHE_HOME/mlxd`, else `~/.cache/mlxd`."""
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlxd"


def install(folder: Path | None = None) -> None:
    """Serve transformers' import table from `folder` (cache_dir()) in this process.
    Idempotent; does nothing once transformers is imported."""
    if MODULE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder(folder or cache_dir()))


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, folder: Path):
        self.folder = folder

    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)  # once: the real finders locate the module
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if spec is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            original = getattr(module, "define_import_structure", None)
            if callable(original):
                module.define_import_structure = _cached(original, self.folder)

        loader.exec_module = exec_module
        return spec


def _cached(original, folder: Path):
    tables: dict[tuple, dict] = {}  # what transformers' own lru_cache held

    def define_import_structure(module_path, prefix=None):
        key = (str(module_path), prefix)
        if key not in tables:
            tables[key] = _load_or_build(original, folder, Path(module_path), prefix)
        return tables[key]

    define_import_structure.__wrapped__ = original  # type: ignore[attr-defined]
    return define_import_structure


def _load_or_build(original, folder: Path, module_path: Path, prefix):
    try:
        file = folder / f"transformers-imports-{_key(module_path, prefix)}.json"
    except OSError:
        return original(module_path, prefix)
    said = {"module_path": str(module_path), "prefix": prefix}
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, KeyError):
        saved = json.loads(file.read_text())
        if {k: saved[k] for k in said} == said:
            return from_json(saved["table"])
    table = original(module_path, prefix)
    # Written before transformers sees the table (its __init__ adds its own names to it).
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        raw = to_json(table)
        if from_json(raw) == table:  # only a table that comes back the same is kept
            _write(file, json.dumps({**said, "table": raw}))
    return table


def _key(module_path: Path, prefix) -> str:
    """Names the installed transformers: an upgrade, a reinstall or another environment
    rewrites its __init__.py (the version is in it) or the models folder."""
    init = Path(sys.modules["transformers"].__file__ or "")
    parts = [str(module_path), str(prefix), str(init)]
    for p in (init, module_path):
        st = p.stat()
        parts.append(f"{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def to_json(table: dict) -> list:
    """{frozenset of backends: {module: set of names}} as lists, in the table's order."""
    return [[sorted(k), [[m, sorted(v)] for m, v in d.items()]] for k, d in table.items()]


def from_json(raw: list) -> dict:
    return {frozenset(k): {m: set(v) for m, v in d} for k, d in raw}


def _write(file: Path, text: str) -> None:
    """Whole or not at all: workers starting at once each write their own file, then rename."""
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=file.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, file)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
