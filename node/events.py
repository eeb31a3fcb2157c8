"""How each role reports: log lines a user understands, the same events as JSON lines, and progress.

`Events` logs each step in words and, for `pulse demo` and the campaign ledger, also appends it
as one JSON line to a file they read. `progress` / `steps` draw a bar for long work on a terminal,
and nothing anywhere else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

T = TypeVar("T")


class Events:
    """Human log lines plus, optionally, machine-readable JSON lines for the demo."""

    def __init__(self, role: str, path: Path | None = None, logger: logging.Logger | None = None) -> None:
        self.role = role
        self.path = path
        self.log = logger or logging.getLogger(f"pulse.{role}")
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, text: str, **fields: Any) -> None:
        self.log.info(text)
        if self.path is None:
            return
        record = {"t": time.time(), "role": self.role, "event": event, **fields}
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def finish(self, **fields: Any) -> None:
        """The last record: peak RSS of this process and anything the role adds."""
        rss_mb = peak_rss_mb()
        self.emit("exit", f"{self.role} exiting (peak RSS {rss_mb:.0f} MB)", peak_rss_mb=rss_mb, **fields)


def mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 10_000 else f"{n} bytes"


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB: VmHWM (Linux keeps `ru_maxrss` across fork+exec,
    so a child of a big parent would report the parent's size), else `ru_maxrss`."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _terminal(console: Console | None) -> Console | None:
    """The console to draw progress on: stderr when it is a terminal and PULSE_PROGRESS is not 0."""
    if os.environ.get("PULSE_PROGRESS") == "0":
        return None
    console = console or Console(stderr=True)
    return console if console.is_terminal else None


@contextlib.contextmanager
def progress(
    description: str, total: float | None = None, *, unit: str = "", console: Console | None = None
) -> Iterator[Callable[[float], None]]:
    """A rich progress bar for long work, on the terminal only: `advance(n)` moves it by n.

    Nothing is drawn when stderr is not a terminal (a role started by `pulse demo` or a test writes
    to a log file, which stays as it was) or when `PULSE_PROGRESS=0`; the bar disappears when done.
    `unit="bytes"` shows sizes and rates.
    """
    shown = _terminal(console)
    if shown is None:
        yield lambda n: None
        return
    count = (DownloadColumn(), TransferSpeedColumn()) if unit == "bytes" else (MofNCompleteColumn(),)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), *count, TimeRemainingColumn())
    with Progress(*columns, console=shown, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def steps(
    items: Iterable[T], description: str, total: int | None = None, console: Console | None = None
) -> Iterator[T]:
    """`items`, with a progress bar (`progress`) while they are consumed; `total` defaults to `len(items)`."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    with progress(description, total, console=console) as advance:
        for item in items:
            yield item
            advance(1)
