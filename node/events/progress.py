"""Progress bars for long work, on a terminal only (rich): downloads, caches, benchmark rounds.

    with progress("checkpoint of round 40", size, unit="bytes") as advance:
        advance(len(chunk))
    for r in steps(range(rounds), "gauntlet rounds"): ...

Nothing is drawn when stderr is not a terminal (a role started by `pulse demo` or a test writes to
a log file that others read, which stays as it was) or when `PULSE_PROGRESS=0`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import TypeVar

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


@contextlib.contextmanager
def transfer(description: str, total: int, *, console: Console | None = None) -> Iterator[Callable[[int, str], None]]:
    """A bar of bytes for a transfer whose progress is known as a total so far: `update(done, note)`
    sets the bytes done and a note after the description (holders, say). Terminal only, as `progress`."""
    shown = _terminal(console)
    if shown is None:
        yield lambda done, note: None
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=shown, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done, note: bar.update(task, completed=done, description=f"{description} {note}".strip())


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
