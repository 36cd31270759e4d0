"""A worker's LoRA adapters: mounted by name, loaded into slots on first use, kept in an LRU
bounded by bytes, and each batch row's slot set before every forward.

Mounting checks the adapter against the base (files.py) and loads it; unmounting forgets the
name at once (new requests naming it get a 404) while rows already running with it finish on
it, after which its slot is free. An idle loaded adapter leaves memory when the byte cap needs
room, and loads again on its next use. Every method but `info`/`names` runs on the engine
thread (the factors are MLX arrays); those two are read by the event loop.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from mlxd.shared.adapters import check_name
from mlxd.shared.errors import Conflict, NotFound, PayloadTooLarge, Unavailable
from mlxd.shared.sizes import format_size
from mlxd.worker.lora.files import AdapterWeights, read_adapter
from mlxd.worker.lora.layer import MultiLoRALinear, Rows
from mlxd.worker.model import mlx_lm_seam as seam

log = logging.getLogger("mlxd.worker.lora")


@dataclass(frozen=True)
class Mounted:
    """What a mounted adapter is, as /adapters and the prompt cache see it."""

    name: str
    path: Path
    digest: str
    rank: int
    nbytes: int
    layers: int

    @property
    def cache_ns(self) -> str:
        """Its rows' prompt-cache namespace: the weights' hash, so a name mounted again with
        other weights never finds the old entries."""
        return f"lora-{self.digest[:24]}"


class Adapters:
    """The adapters of one model; `cap_bytes` bounds the loaded ones' factors."""

    def __init__(self, model: nn.Module, cap_bytes: int):
        self.model = model
        self.cap_bytes = cap_bytes
        self.rows = Rows()
        self.mounted: dict[str, Mounted] = {}
        self._loaded: OrderedDict[str, int] = OrderedDict()  # name -> slot, oldest use first
        self._bytes: dict[str, int] = {}
        self._free: list[int] = []
        self._next_slot = 1  # slot 0 is the base model
        self._bound: dict[int, tuple[int, int]] = {}  # uid -> (owner, slot)
        self._layers: dict[str, MultiLoRALinear] = {}
        self._gone: dict[int, str] = {}  # unmounted slots still used by rows: slot -> name
        self.loads = 0

    # -- the event loop reads these --------------------------------------------------------
    def info(self) -> list[dict]:
        loaded = dict(self._loaded)
        return [
            {
                "name": m.name,
                "path": str(m.path),
                "rank": m.rank,
                "layers": m.layers,
                "bytes": m.nbytes,
                "loaded": m.name in loaded,
            }
            for m in list(self.mounted.values())
        ]

    # -- mount and unmount (engine thread) --------------------------------------------------
    def mount(self, name: str, path: Path) -> Mounted:
        """Check and load the adapter at `path` as `name` (again: its new weights)."""
        check_name(name)
        weights = read_adapter(path, self.model)
        if weights.nbytes > self.cap_bytes:
            raise PayloadTooLarge(
                f"Adapter {name!r} needs {format_size(weights.nbytes)}, more than the adapter "
                f"cache's {format_size(self.cap_bytes)} (adapter_cache_bytes)"
            )
        if name in self.mounted:
            self.unmount(name)
        m = Mounted(name, path, weights.digest, weights.rank, weights.nbytes, len(weights.factors))
        self.mounted[name] = m
        self._load(name, weights)
        log.info("adapter %s mounted from %s (rank %d, %d layers)", name, path, m.rank, m.layers)
        return m

    def unmount(self, name: str) -> None:
        if self.mounted.pop(name, None) is None:
            raise NotFound(f"No adapter named {name!r} is mounted", param="adapter")
        slot = self._loaded.pop(name, None)
        self._bytes.pop(name, None)
        if slot is not None:
            if self._in_use(slot):
                self._gone[slot] = name  # its rows finish on it first
            else:
                self._release(slot)
        log.info("adapter %s unmounted", name)

    # -- rows (engine thread) -----------------------------------------------------------------
    def slot_for(self, name: str | None, held: int = 0) -> int:
        """The slot a row naming `name` uses, loaded now if it was evicted (0: the base).
        `held`: the slot the row had (a row resumed after its adapter was unmounted keeps it
        while the slot still holds that adapter)."""
        if name is None:
            return 0
        m = self.mounted.get(name)
        if m is None and held and self._gone.get(held) == name:
            return held
        if m is None:
            raise NotFound(f"No adapter named {name!r} is mounted on this model", param="model")
        if name in self._loaded:
            self._loaded.move_to_end(name)
            return self._loaded[name]
        weights = read_adapter(m.path, self.model)
        if weights.digest != m.digest:  # its rows' cache namespace is the mounted weights'
            raise Conflict(
                f"Adapter {name!r} changed on disk since it was mounted: mount it again to "
                "serve its new weights"
            )
        return self._load(name, weights)

    def bind(self, uid: int, owner: int, slot: int) -> None:
        self._bound[uid] = (owner, slot)

    def unbind(self, uid: int, owner: int) -> None:
        got = self._bound.get(uid)
        if got is None or got[0] != owner:
            return
        del self._bound[uid]
        slot = got[1]
        if slot in self._gone and not self._in_use(slot):
            del self._gone[slot]
            self._release(slot)

    def reset(self) -> None:
        """A new generator: the uids bound so far mean nothing to it."""
        self._bound.clear()

    def set_rows(self, uids: list[int], chunk: list[tuple[int, int]] | None = None) -> bool:
        """Before a forward over rows `uids` (the seam's row hook; `chunk` is not needed):
        each row's slot; True when any row has one."""
        slots = [self._bound.get(u, (0, 0))[1] for u in uids]
        adapted = any(slots)
        self.rows.idx = mx.array(slots, dtype=mx.uint32) if adapted else None
        return adapted

    # -- slots ---------------------------------------------------------------------------------
    def _in_use(self, slot: int) -> bool:
        return any(s == slot for _, s in self._bound.values())

    def _load(self, name: str, weights: AdapterWeights) -> int:
        for slot in [s for s in self._gone if not self._in_use(s)]:  # lost by a rebuild
            del self._gone[slot]
            self._release(slot)
        self._make_room(weights.nbytes)
        slot = self._free.pop() if self._free else self._new_slot()
        self._wrap(weights.factors)
        for module, (a, b) in weights.factors.items():
            self._layers[module].stack.put(slot, a, b, weights.scale)
        self._loaded[name] = slot
        self._bytes[name] = weights.nbytes
        self.loads += 1
        return slot

    def _new_slot(self) -> int:
        self._next_slot += 1
        return self._next_slot - 1

    def _make_room(self, nbytes: int) -> None:
        """Evict idle adapters, least recently used first, until `nbytes` more fit."""
        for name in list(self._loaded):
            if sum(self._bytes.values()) + nbytes <= self.cap_bytes:
                return
            slot = self._loaded[name]
            if not self._in_use(slot):
                del self._loaded[name]
                del self._bytes[name]
                self._release(slot)
                log.info("adapter %s left memory (least recently used)", name)
        if sum(self._bytes.values()) + nbytes > self.cap_bytes:
            raise Unavailable(
                "Every loaded adapter is in use and the adapter cache is full "
                "(adapter_cache_bytes): retry shortly",
                retry_after_s=1,
            )

    def _release(self, slot: int) -> None:
        for layer in self._layers.values():
            layer.stack.clear(slot)
        self._free.append(slot)

    def _wrap(self, modules: Iterable[str]) -> None:
        """Put a multi-adapter wrapper in the model for each of `modules` that has none yet
        (one walk of the model's modules for them all, not one per layer)."""
        new = [m for m in modules if m not in self._layers]
        if not new:
            return
        named = dict(self.model.named_modules())
        for module in new:
            layer = MultiLoRALinear(named[module], self.rows)
            self.model.update_modules(tree_unflatten([(module, layer)]))
            self._layers[module] = layer
        seam.set_row_hook(self.model, self.set_rows)
