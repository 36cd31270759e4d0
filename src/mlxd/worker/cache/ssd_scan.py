"""The SSD tier's folder into its index: the scan at a worker's start (what a previous run
left, restart survival) and the rescan after another process wrote to the same folder (a hot
reload's old generation drains into it after the new one scanned). Functions of the store
(ssd.py), which holds the index, the lock and the counters they use."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from mlxd.worker.cache.format import DATA_SUFFIX, META_SUFFIX, read_entry
from mlxd.worker.cache.ssd_leftovers import is_temporary

if TYPE_CHECKING:
    from mlxd.worker.cache.ssd import SsdStore

log = logging.getLogger("mlxd.worker.ssd")


def scan(store: SsdStore) -> int:
    """Index what a previous run left (restart survival); drop what is incomplete.

    A folder that cannot be made or listed turns the tier off; a file that cannot be read
    or removed is skipped. Neither stops the worker."""
    try:
        store.dir.mkdir(parents=True, exist_ok=True)
        names = os.listdir(store.dir)
    except OSError as exc:
        store.stats["scan_errors"] += 1
        store.disable(f"cannot use {store.dir}: {exc}")
        return 0
    if not os.access(store.dir, os.W_OK | os.X_OK):
        store.read_only = True
        log.warning("SSD prompt cache folder %s is read-only: no writes", store.dir)
    now = time.time()
    for name in names:
        if is_temporary(name):
            store.leftovers.consider(name, now)
    for name in sorted(names):
        if name.endswith(META_SUFFIX):
            _index(store, name[: -len(META_SUFFIX)])
    for name in names:  # data without its metadata
        if name.endswith(DATA_SUFFIX) and name[: -len(DATA_SUFFIX)] not in store.index:
            store.leftovers.consider(name, now)
    store._enforce_cap()
    return len(store.index)


def rescan(store: SsdStore) -> int:
    """Bring the index in line with the folder after another process wrote to it (the
    generation a hot reload replaced drains into it after this one scanned it): entries
    whose files are gone are forgotten, new ones indexed, except those of a session
    closed here meanwhile (the other process never heard of the close). How many were
    added. Under the lock a write takes to index its entry, so an entry this tier is
    writing is never taken for gone."""
    if store.disabled is not None:
        return 0
    added = 0
    with store._lock:
        try:
            names = os.listdir(store.dir)
        except OSError as exc:
            store.stats["scan_errors"] += 1
            store._quiet.warn("SSD prompt cache rescan", exc)
            return 0
        there = {n[: -len(META_SUFFIX)] for n in names if n.endswith(META_SUFFIX)}
        for e in store.index.entries():
            if e.key not in there:
                store.index.forget(e)  # removed by the other process: nothing to delete
        for key in sorted(there):
            if key in store.index:
                continue
            try:
                e = read_entry(store.dir, key)
            except (FileNotFoundError, ValueError):  # going away, or the scan's to judge
                continue
            except OSError as exc:
                store.stats["scan_errors"] += 1
                store._quiet.warn("SSD prompt cache rescan", exc)
                continue
            if e.session is not None and e.session in store._closed_sessions:
                store._delete_files(key)
                continue
            store.index.add(e)
            added += 1
    store._enforce_cap()
    return added


def _index(store: SsdStore, key: str) -> None:
    try:
        e = read_entry(store.dir, key)
    except (FileNotFoundError, ValueError):  # incomplete or damaged (orjson's error too)
        store.stats["corrupt"] += 1
    except OSError as exc:  # unreadable, or a folder under an entry's name
        store.stats["scan_errors"] += 1
        store._quiet.warn("SSD prompt cache scan", exc)
    else:
        store.index.add(e)
        return
    store._delete_files(key)
