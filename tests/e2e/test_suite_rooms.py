"""The suite's rooms hold: tests/unit imports no MLX (so `make test-unit` stays the seconds-long
loop on any machine, MLX or not). tests/unit/conftest.py refuses processes there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

PROBE = """
import importlib, sys
sys.path[:0] = [{tests!r}, {unit!r}]
pulled = []
for name in {names!r}:
    before = 'mlx' in sys.modules
    importlib.import_module(name)
    if not before and 'mlx' in sys.modules:
        pulled.append(name)
print(','.join(pulled))
"""


def test_no_unit_test_module_imports_mlx():
    names = sorted(p.stem for p in (TESTS / "unit").glob("test_*.py"))
    code = PROBE.format(tests=str(TESTS), unit=str(TESTS / "unit"), names=names)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"these unit test modules import MLX: {done.stdout.strip()}"
