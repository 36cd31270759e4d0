"""Rank 0's bytes to every rank of the group, in the same order on every rank.

Each follower holds one plain TCP connection to rank 0, the link (`open_links`), beside MLX's
own connections: rank 0 writes each iteration's frame (a 4-byte length, then the bytes) to
every link, and a follower reads its frame at the same point of its loop. The model's tensors
travel over mx.distributed; this control stream never mixes with them, so a broadcast neither
waits for the step the decode loop launched ahead nor interleaves with its collectives, and an
idle follower blocks in `recv` instead of in the ring backend's polling (which keeps a core
busy). A follower whose link closes knows rank 0 is gone and stops.
"""

from __future__ import annotations

import logging
import socket
import struct
import time

log = logging.getLogger("mlxd.worker.group")

CONNECT_TIMEOUT_S = 120.0  # ranks load at their own pace before they meet here


class LinkClosed(RuntimeError):
    """A link closed: the rank at its other end exited."""


def _address(link: str) -> tuple[str, int]:
    host, _, port = link.rpartition(":")
    return host, int(port)


def open_links(link: str | None, rank: int, size: int) -> list[socket.socket]:
    """Rank 0: listen on `link` and accept every follower (by the rank it says); a
    follower: connect to it. Returns the connections (a follower's list holds one)."""
    if not link:
        raise ValueError("the spec names no link address for rank 0 (group.link)")
    host, port = _address(link)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    if rank > 0:
        while True:
            try:
                s = socket.create_connection((host, port), timeout=5.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        s.settimeout(None)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(struct.pack("!I", rank))
        return [s]
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(size)
    server.settimeout(CONNECT_TIMEOUT_S)
    peers: dict[int, socket.socket] = {}
    try:
        while len(peers) < size - 1:
            conn, _ = server.accept()
            conn.settimeout(5.0)
            try:
                (r,) = struct.unpack("!I", conn.recv(4, socket.MSG_WAITALL))
            except (OSError, struct.error):
                conn.close()
                continue
            if not 0 < r < size or r in peers:
                conn.close()  # not one of ours
                continue
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peers[r] = conn
    finally:
        server.close()
    return [peers[r] for r in sorted(peers)]


class Channel:
    """The group's broadcast from rank 0 (`group`: an mx.distributed.Group; `links`: rank 0's
    connections to each follower, or a follower's one to rank 0, open_links's)."""

    def __init__(self, group, links: list[socket.socket]):
        self.group = group
        self.rank = group.rank()
        self.size = group.size()
        if len(links) != (self.size - 1 if self.rank == 0 else 1):
            raise ValueError(f"rank {self.rank} of {self.size} needs its links to the group")
        self.links = links

    def exchange(self, payload: bytes = b"") -> bytes:
        """Rank 0: send `payload`, get it back; followers: get rank 0's."""
        return self._send(payload) if self.rank == 0 else self._recv()

    def any(self, flag: bool) -> bool:
        """Whether `flag` is true on any rank (every rank calls this at the same point)."""
        return self._vote(flag)

    # -- over the links -------------------------------------------------------------------
    def _send(self, payload: bytes) -> bytes:
        frame = struct.pack("!I", len(payload)) + payload
        for s in self.links:
            s.sendall(frame)
        return payload

    def _recv(self) -> bytes:
        (n,) = struct.unpack("!I", _read(self.links[0], 4))
        return _read(self.links[0], n) if n else b""

    def _vote(self, flag: bool) -> bool:
        # Followers send their vote up; rank 0 answers with the outcome, before its next frame.
        if self.rank == 0:
            outcome = flag
            for s in self.links:
                outcome = _read(s, 1) != b"\0" or outcome
            for s in self.links:
                s.sendall(b"\1" if outcome else b"\0")
            return outcome
        self.links[0].sendall(b"\1" if flag else b"\0")
        return _read(self.links[0], 1) != b"\0"


def _read(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise LinkClosed("a worker group's link closed: a rank exited")
        buf += chunk
    return bytes(buf)
