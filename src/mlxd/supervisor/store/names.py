"""What a model name means when it is pulled, copied to or created: which Hugging Face
repository a pull downloads, and which model id (and folder under $MLXD_HOME/models) it gets.

A pull names a Hugging Face repository (`mlx-community/Qwen3-8B-4bit`, also `hf.co/…`) or an
Ollama-style `name:tag` from the small table below (docs/api.md lists it); anything else is a
400 that says so. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlxd.shared.errors import BadRequest
from mlxd.shared.wire.ollama import LATEST, model_id_of

# Ollama names → MLX repositories of the same model (mlx-community's 4-bit conversions).
NAME_TABLE: dict[str, str] = {
    "qwen3:0.6b": "mlx-community/Qwen3-0.6B-4bit",
    "qwen3:1.7b": "mlx-community/Qwen3-1.7B-4bit",
    "qwen3:4b": "mlx-community/Qwen3-4B-4bit",
    "qwen3:8b": "mlx-community/Qwen3-8B-4bit",
    "qwen3:latest": "mlx-community/Qwen3-8B-4bit",
    "qwen3:14b": "mlx-community/Qwen3-14B-4bit",
    "qwen2.5:0.5b": "mlx-community/Qwen2.5-0.5B-Instruct-4bit",
    "qwen2.5:7b": "mlx-community/Qwen2.5-7B-Instruct-4bit",
    "qwen2.5:latest": "mlx-community/Qwen2.5-7B-Instruct-4bit",
    "llama3.2:1b": "mlx-community/Llama-3.2-1B-Instruct-4bit",
    "llama3.2:3b": "mlx-community/Llama-3.2-3B-Instruct-4bit",
    "llama3.2:latest": "mlx-community/Llama-3.2-3B-Instruct-4bit",
    "llama3.1:8b": "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
    "llama3.1:latest": "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
    "mistral:7b": "mlx-community/Mistral-7B-Instruct-v0.3-4bit",
    "mistral:latest": "mlx-community/Mistral-7B-Instruct-v0.3-4bit",
}
HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/")
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
REPO_RE = re.compile(rf"{_PART}/{_PART}")
# A model id this daemon may give a folder: [org/]name[:tag], no dot segments.
ID_RE = re.compile(rf"(?:{_PART}/)?{_PART}(?::[A-Za-z0-9._-]{{1,64}})?")


@dataclass(frozen=True)
class PullTarget:
    """A pull: the model id it makes, the repository and revision it downloads."""

    model_id: str
    repo: str
    revision: str | None = None

    @property
    def key(self) -> str:
        """A file name for this id (its staging folder, its lock)."""
        return self.model_id.replace("/", "--")


def pull_target(name: str, revision: str | None = None) -> PullTarget:
    """The repository and model id an Ollama pull's `model` names, else a 400 naming the
    table."""
    raw = name.strip()
    for prefix in HUB_PREFIXES:
        if raw.lower().startswith(prefix):
            raw = raw[len(prefix) :]
            break
    if "/" in raw:
        repo, _, tag = raw.partition(":")
        if tag and tag != LATEST[1:]:
            raise BadRequest(
                f"'{name[:200]}': a Hugging Face repository takes no tag (':{tag[:50]}'); "
                "mlxd downloads MLX repositories whole (pick a revision with 'revision')",
                param="model",
            )
        if not REPO_RE.fullmatch(repo) or ".." in repo:
            raise BadRequest(f"'{name[:200]}' is not a Hugging Face repository id", param="model")
        return PullTarget(repo, repo, revision)
    full = raw.lower() if ":" in raw else raw.lower() + LATEST
    known = NAME_TABLE.get(full)
    if known is None:
        raise BadRequest(
            f"'{name[:200]}' is not a name mlxd knows: pull a Hugging Face repository "
            f"(org/name, e.g. mlx-community/Qwen3-8B-4bit) or one of {', '.join(table_names())}",
            param="model",
        )
    return PullTarget(model_id_of(full), known, revision)


def table_names() -> list[str]:
    """The table's names as a user types them ("qwen3" for "qwen3:latest")."""
    return [model_id_of(n) for n in NAME_TABLE]


def new_model_id(name: str, field: str = "model") -> str:
    """The id a created or copied model gets from its Ollama name ("x:latest" is "x"), or a
    400 for a name that cannot be a folder under $MLXD_HOME/models."""
    model_id = model_id_of(name.strip())
    if not ID_RE.fullmatch(model_id) or ".." in model_id:
        raise BadRequest(
            f"Invalid '{field}': '{name[:200]}' is not a model name mlxd can use "
            "(letters, digits, '.', '_', '-', an optional 'org/' and ':tag')",
            param=field,
        )
    return model_id


def id_parts(model_id: str) -> list[str]:
    """The folder path of an id under $MLXD_HOME/models: "org/name" is org/name/."""
    return model_id.split("/")
