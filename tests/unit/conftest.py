"""Unit tests start no process (tests/e2e does): a test that tries fails at once, saying so.
That they import no MLX either is checked by tests/e2e/test_suite_rooms.py."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest


def _refuse(*_args, **_kw):
    raise AssertionError("a unit test started a process: it belongs in tests/e2e")


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    monkeypatch.setattr(asyncio, "create_subprocess_exec", _refuse)
    monkeypatch.setattr(asyncio, "create_subprocess_shell", _refuse)
    monkeypatch.setattr(os, "fork", _refuse)
