"""Rank 0's bytes to every rank of the group, over mx.distributed itself, and the doorbell.

A broadcast is two all_sums on the CPU stream: the length (followers add 0), then the bytes
(followers add zeros). Every rank calls `exchange` at the same point of its loop; one with
nothing to say sends the length 0 and the second sum is skipped.

MLX's ring backend waits for its peers by polling, which keeps a core busy: fine while the
group decodes, not while it idles. So an idle iteration (every rank knows it is one: the
batch is empty on all of them) first waits on the doorbell, a plain TCP connection from each
follower to rank 0 that rank 0 rings just before the collective. A follower whose doorbell
closes knows rank 0 is gone and stops.
"""

from __future__ import annotations

import logging
import socket
import struct
import time

import mlx.core as mx
import numpy as np

log = logging.getLogger("mlxd.worker.group")

CONNECT_TIMEOUT_S = 120.0  # ranks load at their own pace before they meet here


class RankZeroGone(RuntimeError):
    """The doorbell closed: rank 0 exited."""


def _address(doorbell: str) -> tuple[str, int]:
    host, _, port = doorbell.rpartition(":")
    return host, int(port)


def open_doorbell(doorbell: str, rank: int, size: int) -> list[socket.socket]:
    """Rank 0: listen on `doorbell` and accept every follower (by the rank it says); a
    follower: connect to it. Returns the connections (a follower's list holds one)."""
    host, port = _address(doorbell)
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
    """The group's broadcast from rank 0 (`group`: an mx.distributed.Group; `bells`: the
    doorbell connections, open_doorbell's)."""

    def __init__(self, group, bells: list[socket.socket] | None = None):
        self.group = group
        self.rank = group.rank()
        self.size = group.size()
        self.bells = bells or []

    def exchange(self, payload: bytes = b"", idle: bool = False, stream=None) -> bytes:
        """Rank 0: send `payload`, get it back; followers: get rank 0's (theirs is ignored).
        `idle`: ring the doorbell first (followers wait on it, not in the collective).
        `stream`: the engine's. The model's own collectives of a step launched ahead
        (decode.py) are still in flight there; on any other stream this broadcast's messages
        would interleave with theirs."""
        stream = stream if stream is not None else mx.cpu
        if idle:
            self._ring()
        mine = payload if self.rank == 0 else b""
        n = mx.distributed.all_sum(
            mx.array([len(mine)], dtype=mx.int32), group=self.group, stream=stream
        )
        length = int(n.item())
        if length == 0:
            return b""
        buf = np.frombuffer(mine, dtype=np.uint8) if mine else np.zeros(length, np.uint8)
        out = mx.distributed.all_sum(mx.array(buf), group=self.group, stream=stream)
        return bytes(np.array(out, copy=False))

    def any(self, flag: bool, stream=None) -> bool:
        """Whether `flag` is true on any rank (every rank calls this at the same point)."""
        stream = stream if stream is not None else mx.cpu
        n = mx.distributed.all_sum(
            mx.array([int(flag)], dtype=mx.int32), group=self.group, stream=stream
        )
        return int(n.item()) > 0

    def _ring(self) -> None:
        if self.rank == 0:
            for s in self.bells:
                s.sendall(b"\x01")
        elif self.bells and self.bells[0].recv(1) == b"":
            raise RankZeroGone("rank 0 of the worker group exited")
