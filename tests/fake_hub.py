"""A local stand-in for the Hugging Face hub: the part of its API a pull uses, on 127.0.0.1.

huggingface_hub (2.x, as installed) asks `GET /api/models/<repo>/revision/<rev>?blobs=True`
for a repository's files (size, `blobId`, `lfs.sha256`) and downloads each file with
`GET /<repo>/resolve/<commit>/<file>` (ETag, X-Repo-Commit, Content-Length, and a `Range:
bytes=N-` request answered 206 when it resumes). Point huggingface_hub here with HF_ENDPOINT.
Unknown repositories and revisions answer 404 with the hub's X-Error-Code.

Faults, per (repo, file): `drop_once` sends half the file and closes the connection, once;
`hold` sends half and waits until its event is set; `corrupt` flips a byte. `requests` records
(method, path, Range header) of every request. Plain module, like tiny_model.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_SUFFIXES = (".safetensors", ".gguf")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>[^/?]+)$")
INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/?]+)(?:/revision/(?P<rev>[^/?]+))?")


class FakeHub:
    """Serves repositories made from local folders: `add(repo, folder)`."""

    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.drop_once: set[tuple[str, str]] = set()
        self.corrupt: set[tuple[str, str]] = set()
        self.hold: dict[tuple[str, str], threading.Event] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, repo: str, folder: Path | None = None, files: dict[str, bytes] | None = None):
        """A repository with `folder`'s files (or `files`) at COMMIT."""
        content = dict(files or {})
        if folder is not None:
            content.update(
                {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
            )
        self.repos[repo] = content

    def downloads(self, repo: str, file: str) -> list[str | None]:
        """The Range header of each GET of `file` so far (None: the whole file)."""
        path = f"/{repo}/resolve/{COMMIT}/{file}"
        return [r for m, p, r in self.requests if m == "GET" and p == path]

    def close(self) -> None:
        for event in self.hold.values():
            event.set()
        self.server.shutdown()
        self.server.server_close()


def _sibling(name: str, data: bytes) -> dict:
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    entry = {"rfilename": name, "size": len(data), "blobId": blob}
    if name.endswith(LFS_SUFFIXES):
        sha = hashlib.sha256(data).hexdigest()
        entry["lfs"] = {"size": len(data), "sha256": sha, "pointerSize": 134}
    return entry


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _json(self, status: int, body: dict, headers: dict | None = None) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(raw)

        def _missing(self, code: str) -> None:
            self._json(404, {"error": code}, {"X-Error-Code": code})

        def do_HEAD(self):
            self.do_GET(head=True)

        def do_GET(self, head: bool = False):
            path = self.path.split("?", 1)[0]
            hub.requests.append((self.command, path, self.headers.get("Range")))
            if m := RESOLVE.match(path):
                return self._resolve(m["repo"], m["rev"], m["file"], head)
            if m := INFO.match(path):
                return self._info(m["repo"], m["rev"])
            self._missing("EntryNotFound")

        def _info(self, repo: str, rev: str | None) -> None:
            files = hub.repos.get(repo)
            if files is None:
                return self._missing("RepoNotFound")
            if rev not in (None, "main", COMMIT):
                return self._missing("RevisionNotFound")
            siblings = [_sibling(n, d) for n, d in files.items()]
            self._json(200, {"id": repo, "sha": COMMIT, "siblings": siblings})

        def _resolve(self, repo: str, rev: str, name: str, head: bool) -> None:
            files = hub.repos.get(repo)
            if files is None:
                return self._missing("RepoNotFound")
            if name not in files:
                return self._missing("EntryNotFound")
            data = files[name]
            if (repo, name) in hub.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start = 0
            if m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or ""):
                start = int(m[1])
            sibling = _sibling(name, files[name])
            etag = sibling.get("lfs", {}).get("sha256") or sibling["blobId"]
            self.send_response(206 if start else 200)
            self.send_header("ETag", f'"{etag}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            body = data[start:]
            key = (repo, name)
            if key in hub.drop_once and not start:
                hub.drop_once.discard(key)
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if key in hub.hold and not start:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                hub.hold[key].wait(60)
                body = body[len(body) // 2 :]
            try:
                self.wfile.write(body)
            except OSError:  # the client left
                self.close_connection = True

    return Handler
