"""Import progress on stderr: a rich progress bar on a terminal, a plain line every tenth of
the work otherwise (logs, pipes, CI), or nothing."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # rich is imported only when a bar is drawn
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

MODES = ("auto", "bar", "lines", "none")


class Progress:
    """Counts converted tensors; `mode` is one of MODES ("auto": bar on a TTY, else lines)."""

    def __init__(self, mode: str = "none", stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode, self.total, self.done, self._last_tenth = mode, 0, 0, 0
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None

    def start(self, total: int, what: str) -> None:
        """Begin counting `total` steps of `what` (e.g. "model.gguf: 272 tensors")."""
        self.total, self.done, self._last_tenth = max(total, 1), 0, 0
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(f"importing {what}", total=self.total)
        elif self.mode == "lines":
            print(f"importing {what}", file=self.stream, flush=True)

    def advance(self) -> None:
        """One more step done."""
        self.done += 1
        if self._bar is not None:
            assert self._task is not None  # added with the bar
            self._bar.update(self._task, completed=self.done)
        elif self.mode == "lines" and (tenth := self.done * 10 // self.total) > self._last_tenth:
            self._last_tenth = tenth
            pct = self.done * 100 // self.total
            print(f"  {self.done}/{self.total} tensors ({pct}%)", file=self.stream, flush=True)

    def close(self) -> None:
        """Stop the bar (the terminal keeps its last state)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
