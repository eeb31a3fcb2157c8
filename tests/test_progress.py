"""Progress bars: drawn on a terminal, never into a file or a pipe that logs and tests read."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from node.events import progress, steps


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=100), out


def test_a_terminal_shows_the_bar_and_the_items_all_pass() -> None:
    shown, out = console(terminal=True)
    assert list(steps(range(5), "pre-training the base model", console=shown)) == [0, 1, 2, 3, 4]
    assert "pre-training the base model" in out.getvalue()
    shown, out = console(terminal=True)
    with progress("fetching the checkpoint", 2_000_000, unit="bytes", console=shown) as advance:
        advance(1_000_000)
    assert "fetching the checkpoint" in out.getvalue()


def test_nothing_is_written_off_a_terminal_or_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet, out = console(terminal=False)
    assert list(steps(["a", "b"], "gauntlet rounds", console=quiet)) == ["a", "b"]
    with progress("fetching", 10, console=quiet) as advance:
        advance(5)
    assert out.getvalue() == ""
    monkeypatch.setenv("PULSE_PROGRESS", "0")
    shown, out = console(terminal=True)
    assert list(steps(range(3), "rounds", console=shown)) == [0, 1, 2] and out.getvalue() == ""
