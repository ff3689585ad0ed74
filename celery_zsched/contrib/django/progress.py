"""A small progress bar for management commands (stderr; plain lines when not a terminal)."""

from __future__ import annotations

import time
from typing import TextIO


class Progress:
    """Shows ``phase [#####-----] 50% 5000/10000`` on one line, at most 10 times a second.

    On a stream that is not a terminal (a log file, CI) it prints one line per
    finished phase instead of redrawing. ``enabled=False`` prints nothing.
    """

    def __init__(self, stream: TextIO, *, enabled: bool = True, width: int = 30) -> None:
        self.stream = stream
        self.enabled = enabled
        self.width = width
        self.tty = enabled and bool(getattr(stream, "isatty", lambda: False)())
        self.phase = ""
        self.total = 0
        self.done = 0
        self._started = 0.0
        self._drawn = 0.0

    def start(self, phase: str, total: int) -> None:
        """Begin a phase of ``total`` steps (ends the previous one)."""
        if self.phase:
            self.finish()
        self.phase, self.total, self.done = phase, total, 0
        self._started = time.perf_counter()
        self._drawn = 0.0
        self._draw()

    def update(self, done: int) -> None:
        """Report ``done`` steps of the current phase."""
        self.done = done
        now = time.perf_counter()
        if now - self._drawn >= 0.1:
            self._draw()

    def advance(self, steps: int) -> None:
        """Report ``steps`` more steps of the current phase."""
        self.update(self.done + steps)

    def finish(self) -> None:
        """End the current phase with a final line."""
        if not self.phase:
            return
        self.done = max(self.done, self.total)
        if self.enabled:
            seconds = time.perf_counter() - self._started
            line = self._line() + f" {seconds:.1f}s"
            self.stream.write(("\r" + line + "\n") if self.tty else line + "\n")
            self.stream.flush()
        self.phase = ""

    def _draw(self) -> None:
        self._drawn = time.perf_counter()
        if self.tty:
            self.stream.write("\r" + self._line())
            self.stream.flush()

    def _line(self) -> str:
        total = max(self.total, 1)
        ratio = min(1.0, self.done / total)
        filled = int(ratio * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        return f"{self.phase:<9} [{bar}] {ratio:4.0%} {self.done}/{self.total}"
