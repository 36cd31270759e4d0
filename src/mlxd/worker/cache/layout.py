"""Where a model's SSD prompt-cache entries live: `<cache root>/<safe model id>/<fingerprint>/`.

The fingerprint keeps an entry from restoring into a model it does not belong to; the model id
keeps two copies of one model (two ids, one folder) from scanning, evicting and deleting each
other's files. No MLX here (the shapes check is kv_arrays.kv_layout).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

from mlxd.worker.cache.format import FORMAT_VERSION

log = logging.getLogger("mlxd.worker.cache")

MAX_NAME_CHARS = 64  # model ids can be long hub paths; folder names stay short and portable
_SAFE = re.compile(r"[a-z0-9][a-z0-9._-]*")


def fingerprint(model_path: Path, kv_scheme: str) -> str:
    """Model config, tokenizer, weight files, KV scheme and format: what must match."""
    h = hashlib.sha256()
    try:
        cfg = json.loads((model_path / "config.json").read_text())
        h.update(json.dumps(cfg, sort_keys=True).encode())
    except (OSError, ValueError):
        h.update(str(model_path).encode())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        f = model_path / name
        if f.is_file():
            h.update(hashlib.sha256(f.read_bytes()).digest())
    # Weights re-exported under the same config must not restore old KV: their names, sizes
    # and modification times stand in for their content (hashing gigabytes would be slow).
    for f in sorted(model_path.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    h.update(f"{kv_scheme}|v{FORMAT_VERSION}".encode())
    return h.hexdigest()[:20]


def safe_name(model_id: str) -> str:
    """A folder name for `model_id`: the id itself when it is short, lower-case and plain;
    otherwise its plain characters plus a short hash, so distinct ids stay distinct (also on
    case-insensitive file systems) and no id can climb out of the cache root."""
    if len(model_id) <= MAX_NAME_CHARS and _SAFE.fullmatch(model_id) and ".." not in model_id:
        return model_id
    plain = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id).strip("._-")[: MAX_NAME_CHARS - 9]
    digest = hashlib.sha256(model_id.encode()).hexdigest()[:8]
    return f"{plain}-{digest}" if plain else digest


def ssd_folder(root: Path, model_id: str, fp: str) -> Path:
    """This model's SSD folder; a folder of the old layout (`<root>/<fingerprint>/`) moves in
    on first use, so entries written before the per-id layout are kept (by the first id that
    starts; another id of the same folder starts empty)."""
    folder = root / safe_name(model_id) / fp
    old = root / fp
    try:
        # Entry files only: a folder with subfolders is some model id's folder, not old data.
        if old.is_dir() and not folder.exists() and not any(p.is_dir() for p in old.iterdir()):
            folder.parent.mkdir(parents=True, exist_ok=True)
            os.rename(old, folder)
            log.info("moved SSD prompt cache %s to %s", old, folder)
    except OSError as exc:  # a race with another worker, or a read-only root: start empty
        log.warning("could not move old SSD prompt cache %s: %s", old, exc)
    return folder
