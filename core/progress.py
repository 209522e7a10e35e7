"""Progress of a long wait on standard error, so that tables and ``--json`` on stdout stay clean.

On a terminal a transient rich bar; elsewhere plain lines, at most one
every :data:`PROGRESS_SECONDS`, which a log keeps readable. Every wait
over 2 s says what it is doing (calibration, ``evaluate``).
"""

from __future__ import annotations

import sys
import time

PROGRESS_SECONDS = 2.0  # without a terminal, a progress line at most this often: no wait over 2 s goes unexplained


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


class Progress:
    """``total`` steps of ``doing`` (``calibrating ml.linreg``), counted in ``unit`` (``measurements``)."""

    def __init__(self, doing: str, total: int, unit: str, bar: bool | None = None):
        self.doing, self.total, self.unit, self.count = doing, total, unit, 0
        self.began = self.said = time.monotonic()
        self.bar = self.task = None
        if stderr_is_terminal() if bar is None else bar:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                           TimeElapsedColumn(), transient=True, console=Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task(doing, total=total)

    def say(self, text: str) -> None:
        """One line, whatever the display (a bar shows it above itself)."""
        if self.bar is not None:
            self.bar.console.print(f"crossover: {text}", markup=False, highlight=False)
        else:
            print(f"crossover: {text}", file=sys.stderr, flush=True)
        self.said = time.monotonic()

    def advance(self) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        elif time.monotonic() - self.said >= PROGRESS_SECONDS:
            self.say(f"{self.doing}: {self.count}/{self.total} {self.unit}, {time.monotonic() - self.began:.0f} s")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
