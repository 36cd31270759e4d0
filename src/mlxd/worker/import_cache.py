"""transformers' lazy-import table kept on disk between worker starts.

mlx-lm imports transformers (its tokenizers), and transformers 5 builds its lazy-import table
at every `import transformers` by reading each of its ~3,400 model source files for their
`__all__` (`transformers.utils.import_utils.define_import_structure`): 0.9 s of a worker's
2.7 s of imports on a 2-core Linux machine, paid again at every load, reload and restart. The
table depends on the installed transformers files only, so the first worker computes it and
later ones read it back from `<cache>/mlxd/transformers-imports-<key>.json`. The key is the
table's arguments and every transformers source file's path, size and modification time (one
walk of the package per process, ~20 ms): an upgrade, a reinstall, another environment or a
file edited in place names another file. Files unused for STALE_DAYS go when one is written.

`install()` puts a finder on `sys.meta_path` for that one module, before anything imports
transformers; the finder hands the module back with `define_import_structure` wrapped. Anything
unexpected (another transformers layout, no home folder, an unreadable or damaged file, a table
that does not round-trip) leaves transformers to do what it does without us.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import time
from pathlib import Path

MODULE = "transformers.utils.import_utils"
PREFIX = "transformers-imports-"
STALE_DAYS = 30  # a table not written or read for this long is removed (another install's)


def cache_dir(env: os._Environ | dict = os.environ) -> Path:
    """Where the tables go: `$XDG_CACHE_HOME/mlxd`, else `~/.cache/mlxd`."""
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlxd"


def install(folder: Path | None = None) -> None:
    """Serve transformers' import table from `folder` (cache_dir()) in this process.
    Idempotent; does nothing once transformers is imported."""
    if MODULE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    try:
        folder = folder or cache_dir()
    except RuntimeError:  # no home folder to keep it in: transformers builds it as usual
        return
    sys.meta_path.insert(0, _Finder(folder))


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
        file = folder / f"{PREFIX}{_key(module_path, prefix)}.json"
    except Exception:  # no key, no cache
        return original(module_path, prefix)
    said = {"module_path": str(module_path), "prefix": prefix}
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, KeyError):
        saved = json.loads(file.read_text())
        if {k: saved[k] for k in said} == said:
            table = from_json(saved["table"])
            os.utime(file)  # in use: not stale
            return table
    table = original(module_path, prefix)
    # Written before transformers sees the table (its __init__ adds its own names to it).
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        raw = to_json(table)
        if from_json(raw) == table:  # only a table that comes back the same is kept
            _write(file, json.dumps({**said, "table": raw}))
            _prune(folder)
    return table


def _key(module_path: Path, prefix) -> str:
    package = Path(sys.modules["transformers"].__file__ or "").parent
    parts = [str(module_path), str(prefix), _tree(str(package))]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


@functools.cache
def _tree(package: str) -> str:
    """Every source file under `package`: its path, size and modification time, hashed."""
    h = hashlib.sha256(package.encode())
    folders = [package]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        folders.append(e.path)
                elif e.name.endswith(".py"):
                    st = e.stat(follow_symlinks=False)
                    h.update(f"{e.path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _prune(folder: Path) -> None:
    """Tables unused for STALE_DAYS (other installs'), and temporary files of writes that
    died, go."""
    now = time.time()
    for f in folder.glob(f"{PREFIX}*"):
        age = now - f.stat().st_mtime
        if age > STALE_DAYS * 86400 or (f.name.endswith(".tmp") and age > 3600):
            with contextlib.suppress(OSError):
                f.unlink()


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
