"""The Hugging Face hub, through huggingface_hub: the one module that imports it (a pull's
file list and its downloads), pinned by tests/unit/test_model_store_parts.py.

The file list comes from `HfApi.model_info(files_metadata=True)` (sizes, LFS sha256, git blob
ids); each file from `hf_hub_url` through `file_download.http_get` into a `.part` file of our
own, resumed from its size with a Range request. `hf_hub_download` is not used for the
transfer: in huggingface_hub 2.x its partial file is unique to the process and deleted when a
download fails, so an interrupted pull would start each file again from zero.
`HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` are the hub's own settings, read by it.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlxd.shared.errors import BadGateway, MlxdError, NotFound, PayloadTooLarge, Unavailable

CHUNK_BYTES = 1 << 20  # progress and cancellation every MiB (the hub's default: 10 MiB)


class Cancelled(Exception):
    """A download stopped on request (its client left, or the daemon is stopping)."""


@dataclass(frozen=True)
class RemoteFile:
    """A file of a repository: its size and what verifies it (LFS sha256, else git blob id)."""

    name: str
    size: int
    sha256: str | None = None
    blob_id: str | None = None

    @property
    def digest(self) -> str:
        """The digest a progress line shows (Ollama's `sha256:…`; git's id for small files)."""
        return f"sha256:{self.sha256}" if self.sha256 else f"sha1:{self.blob_id or ''}"


@dataclass(frozen=True)
class Manifest:
    """A repository at one commit: the files a pull downloads."""

    repo: str
    commit: str
    files: tuple[RemoteFile, ...]


def hub_error(exc: BaseException, repo: str) -> MlxdError:
    """A hub failure as one line in the client's envelope (404, 503 offline, 502 upstream)."""
    from huggingface_hub import errors

    if isinstance(exc, errors.RevisionNotFoundError):
        return NotFound(f"'{repo}' has no such revision on Hugging Face", param="revision")
    if isinstance(exc, errors.RepositoryNotFoundError):  # gated and private ones too
        return NotFound(
            f"'{repo}' was not found on Hugging Face (a private or gated repository needs "
            "HF_TOKEN in the daemon's environment)",
            param="model",
            code="model_not_found",
        )
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return Unavailable(f"cannot download {repo}: HF_HUB_OFFLINE is set")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return PayloadTooLarge(f"cannot download {repo}: no space left on the disk")
    if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None:
        return BadGateway(f"cannot download {repo}: the hub answered {exc.response.status_code}")
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return BadGateway(f"cannot download {repo}: {reason}")


class Hub:
    """The hub at `endpoint` (None: HF_ENDPOINT, else huggingface.co)."""

    def __init__(self, endpoint: str | None = None):
        self.endpoint = endpoint

    def manifest(self, repo: str, revision: str | None) -> Manifest:
        """The repository's files at `revision` (None: main) and the commit it resolves to."""
        from huggingface_hub import HfApi

        try:
            info = HfApi(endpoint=self.endpoint).model_info(
                repo, revision=revision, files_metadata=True
            )
        except Exception as exc:
            raise hub_error(exc, repo) from None
        files = tuple(
            RemoteFile(
                s.rfilename,
                s.lfs.size if s.lfs is not None else (s.size or 0),
                s.lfs.sha256 if s.lfs is not None else None,
                s.blob_id,
            )
            for s in info.siblings or ()
        )
        return Manifest(repo, info.sha or revision or "main", files)

    def fetch(
        self, repo: str, commit: str, file: RemoteFile, part: Path, on_bytes: Callable[[int], None]
    ) -> None:
        """Download `file` into `part`, going on from the bytes already there; `on_bytes(n)` is
        called as they arrive (it may raise to stop the download)."""
        from huggingface_hub import constants, hf_hub_url
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils import build_hf_headers

        constants.DOWNLOAD_CHUNK_SIZE = CHUNK_BYTES
        url = hf_hub_url(repo, file.name, revision=commit, endpoint=self.endpoint)
        headers = {**build_hf_headers(), "Accept-Encoding": "identity"}  # Range needs raw bytes
        have = part.stat().st_size if part.exists() else 0
        with part.open("ab") as out:
            try:
                http_get(
                    url,
                    out,
                    resume_size=have,
                    headers=headers,
                    expected_size=file.size,
                    displayed_filename=file.name,
                    tqdm_class=_counter(on_bytes),
                )
            except (MlxdError, Cancelled):
                raise
            except Exception as exc:
                raise hub_error(exc, repo) from None


def _counter(on_bytes: Callable[[int], None]) -> type:
    """A stand-in for tqdm (its interface as http_get uses it) that reports bytes."""

    class Counter:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n: int | float | None = 1) -> None:
            on_bytes(int(n or 0))

    return Counter
