"""The coding-agent CLIs the e2e tests drive, installed from npm into a cache folder.

Plain module (no pytest): `install_agents()` returns the paths of the `claude` and `codex`
executables, installing the pinned versions once into ~/.cache/mlxd-tests/agents; it raises
AgentsUnavailable (the tests skip) when npm is missing or the registry cannot be reached.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.197"
CODEX = "@openai/codex@0.171.0"
CACHE = Path("~/.cache/mlxd-tests/agents").expanduser()


class AgentsUnavailable(RuntimeError):
    """npm is missing or unreachable: the agent tests cannot run here."""


def _installed(root: Path) -> dict[str, Path] | None:
    bins = {"claude": root / "node_modules/.bin/claude", "codex": root / "node_modules/.bin/codex"}
    stamp = root / "versions.txt"
    if (
        all(p.exists() for p in bins.values())
        and stamp.is_file()
        and stamp.read_text() == f"{CLAUDE_CODE}\n{CODEX}\n"
    ):
        return bins
    return None


def install_agents(root: Path = CACHE, timeout_s: float = 600.0) -> dict[str, Path]:
    """Paths of `claude` and `codex` at the pinned versions, installed if need be."""
    found = _installed(root)
    if found:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise AgentsUnavailable("npm is not installed")
    root.mkdir(parents=True, exist_ok=True)
    try:
        probe = subprocess.run(
            [npm, "view", CODEX, "version"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        raise AgentsUnavailable("the npm registry did not answer within 60 s") from None
    if probe.returncode != 0:
        raise AgentsUnavailable(f"the npm registry is unreachable: {probe.stderr.strip()[-300:]}")
    done = subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(root),
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            CLAUDE_CODE,
            CODEX,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(f"npm install failed:\n{done.stderr[-2000:]}")
    (root / "versions.txt").write_text(f"{CLAUDE_CODE}\n{CODEX}\n")
    found = _installed(root)
    if not found:
        raise RuntimeError(f"npm install left no claude/codex under {root}/node_modules/.bin")
    return found


if __name__ == "__main__":
    print(install_agents())
