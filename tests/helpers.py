"""Bounded waiting for tests: poll a condition until a timeout, and read a swarm's event logs.

    found = poll(lambda: reader.get(SubmissionHeader, 1), timeout=10)     # truthy, or the last value
    await apoll(lambda: service.active == 0, timeout=10)                  # the same from async code
    wait_for(lambda: events(out).has(Submitted, "miner0"), 150, "miner0's submission")

Every wait has a timeout; `wait_for` raises with what it waited for (and the logs it was given),
`poll`/`apoll` return the last value so the caller's assert says what was wrong.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from node.events import EventLog, read_events
from protocol.messages import BlobRef, OuterStep

T = TypeVar("T")


def poll(check: Callable[[], T], timeout: float, interval: float = 0.1) -> T:
    """`check()` as soon as it is truthy, or its value at `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(interval)
    return result


async def apoll(check: Callable[[], T], timeout: float, interval: float = 0.02, *, blocking: bool = False) -> T:
    """`poll` for async code; `blocking=True` runs `check` in an executor so it cannot stall the loop."""
    loop = asyncio.get_running_loop()

    async def value() -> T:
        return await loop.run_in_executor(None, check) if blocking else check()

    deadline = time.monotonic() + timeout
    while not (result := await value()) and time.monotonic() < deadline:
        await asyncio.sleep(interval)
    return result


def wait_for(check: Callable[[], object], timeout: float, what: str, logs: Path | None = None) -> None:
    """Return once `check()` is truthy; else fail naming `what`, with the tail of each log in `logs`."""
    if poll(check, timeout, interval=0.2):
        return
    tails = {p.name: p.read_text(errors="replace")[-1500:] for p in sorted(logs.glob("*.log"))} if logs else {}
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; logs: {tails}")


def wait_exits(popens: Sequence[subprocess.Popen[Any]], timeout: float) -> None:
    """Wait for every process to exit within one shared `timeout` (TimeoutExpired otherwise)."""
    deadline = time.monotonic() + timeout
    for popen in popens:
        popen.wait(max(deadline - time.monotonic(), 0.1))


def events(out: Path) -> EventLog:
    """Every event the swarm in `out` has written so far (`out/events/*.jsonl`), typed; query it with
    `EventLog.has(kind, name, round_)`, `.events(kind, name)`."""
    return read_events(out / "events")


def commitments(tag: str = "") -> dict[str, Any]:
    """The audit commitments of a `RoundResult` (FP32 states, outer step, evidence) as placeholders,
    for tests that build a result by hand: `RoundResult(..., **commitments())`."""

    def h(text: str) -> str:
        return hashlib.sha256(f"{tag}/{text}".encode()).hexdigest()

    return {
        "master_before": h("fp32-before"),
        "master_after": h("fp32-after"),
        "outer": OuterStep(lr=1.0, momentum=0.0, nesterov=False, steps=0),
        "evidence": BlobRef(sha256=h("evidence"), size=100),
        "master_checkpoint": None,
    }


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""A metrics page: (name, sorted labels) -> value."""


def scrape(url: str) -> Samples:
    """The Prometheus page at `url`, parsed."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
