"""Folders are layers: a module imports only its own room and the rooms below it (read from
the source, no import needed). The order is docs/architecture.md's; a new room goes in it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Top to bottom. A package's own modules (e.g. supervisor/cli.py) are its entry points: the
# top of that package, which nothing below may import.
LAYERS = {
    "mlxd.supervisor": [
        ["mlxd.supervisor"],
        ["mlxd.supervisor.ctl"],
        ["mlxd.supervisor.admin"],
        ["mlxd.supervisor.http"],
        ["mlxd.supervisor.ui"],
        ["mlxd.supervisor.store"],
        ["mlxd.supervisor.registry"],
        ["mlxd.supervisor.scheduling"],
        ["mlxd.supervisor.lifecycle"],
        ["mlxd.supervisor.policy"],
        ["mlxd.supervisor.catalog"],
    ],
    "mlxd.worker": [
        ["mlxd.worker"],
        ["mlxd.worker.group"],
        ["mlxd.worker.api"],
        ["mlxd.worker.embed"],
        ["mlxd.worker.speech"],
        ["mlxd.worker.chat"],
        ["mlxd.worker.grammar"],
        ["mlxd.worker.engine"],
        ["mlxd.worker.vision"],
        ["mlxd.worker.lora"],
        ["mlxd.worker.cache"],
        ["mlxd.worker.importers"],
        ["mlxd.worker.model"],
        ["mlxd.worker.dist"],
        ["mlxd.worker.kv"],
    ],
    # shared imports nothing of ours but itself (its wire bodies and its core are one room)
    "mlxd.shared": [["mlxd.shared", "mlxd.shared.wire"]],
}


def room_of(module: str) -> str:
    """The folder (package) a module lives in; engine/sched/x.py is in the engine room."""
    top = ".".join(module.split(".")[:2])
    best = top
    for layer in LAYERS.get(top, []):
        for room in layer:
            if (module + ".").startswith(room + ".") and len(room) > len(best):
                best = room
    return best


def rank(room: str) -> tuple[str, int]:
    top = ".".join(room.split(".")[:2])
    for i, layer in enumerate(LAYERS[top]):
        if room in layer:
            return top, i
    raise AssertionError(f"{room} is in no layer: add it to LAYERS and docs/architecture.md")


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    """Every mlxd module `path` imports (type-checking imports too: they are a dependency)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mlxd"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                is_module = (SRC / Path(*full.split("."))).with_suffix(".py").exists()
                out.append((node.lineno, full if is_module else node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("mlxd")]
    return out


def upward_imports() -> list[str]:
    found = []
    for path in sorted((SRC / "mlxd").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module.count(".") < 2:  # mlxd/__init__.py, the packages' own __init__
            continue
        mine = room_of(module)
        top, my_rank = rank(mine)
        for line, target in imports(path, module):
            theirs = room_of(target)
            their_top = ".".join(theirs.split(".")[:2])
            if their_top != top:
                if their_top != "mlxd.shared" and theirs != "mlxd":
                    found.append(f"{path.relative_to(SRC)}:{line} {target} (another package)")
                continue
            if rank(theirs)[1] < my_rank:
                found.append(f"{path.relative_to(SRC)}:{line} imports {target} (above {mine})")
    return found


def test_no_module_imports_a_room_above_its_own():
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    # Guard against a check that passes vacuously: the kv room importing the engine is upward.
    assert rank("mlxd.worker.kv")[1] > rank("mlxd.worker.engine")[1]
    assert room_of("mlxd.worker.engine.sched.planner") == "mlxd.worker.engine"
    probe = tmp_path / "probe.py"
    probe.write_text("from mlxd.worker.engine.loop import Engine\n")
    assert imports(probe, "mlxd.worker.kv.probe") == [(1, "mlxd.worker.engine.loop")]
    assert rank(room_of("mlxd.worker.engine.loop"))[1] < rank("mlxd.worker.kv")[1]
