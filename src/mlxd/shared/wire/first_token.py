"""The worker's first-token marker: what a worker's stream carries, and how the proxy cuts it.

A worker writes `FIRST_TOKEN` (an SSE comment, which every SSE client skips) in front of the
first event of a stream that carries generated text or a tool call, whatever the API dialect.
The supervisor's proxy cuts it out as it passes (`FirstTokenCutter`) and times the first token
by it, so neither side has to recognise three dialects' token events.
"""

from __future__ import annotations

FIRST_TOKEN = b": mlxd-first-token\n\n"


class FirstTokenCutter:
    """Removes the marker from a stream passed through chunk by chunk.

    The marker may arrive split across two chunks: a chunk's tail that could begin it is held
    back until the next chunk decides (only an unfinished comment line is ever held).
    """

    def __init__(self) -> None:
        self.seen = False
        self._held = b""

    def cut(self, chunk: bytes) -> tuple[bytes, bool]:
        """The bytes to pass on now, and whether the marker was in them (it is cut out)."""
        if self.seen:
            return chunk, False
        buf, self._held = self._held + chunk, b""
        at = buf.find(FIRST_TOKEN)
        if at >= 0:
            self.seen = True
            return buf[:at] + buf[at + len(FIRST_TOKEN) :], True
        keep = next(
            (
                n
                for n in range(min(len(FIRST_TOKEN) - 1, len(buf)), 0, -1)
                if buf.endswith(FIRST_TOKEN[:n])
            ),
            0,
        )
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> bytes:
        """What is still held when the stream ends."""
        held, self._held = self._held, b""
        return held
