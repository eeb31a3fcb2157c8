"""What a node catching up shows while it waits: a join's progress, a fetch's bar, a run not found.

with JoinReport("checkpoint of round 12", plan) as report:   # a bar, and a log line every 5 s
    path = await peer.fetch_pieces(sha256, size, r, pieces, check, on_progress=report.update)
path = await fetch_showing(peer, sha256, size, r, "patch 13")   # `peer.fetch` with a bar
quiet = QuietWatch(events, peer, 30.0); quiet.check()           # "nothing of the run seen": why
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from node.events import Events, mb, progress
from node.events.models import Quiet
from node.events.progress import transfer
from node.net.peer import Peer
from node.net.pieces import FetchProgress
from node.roles.joinplan import JoinPlan

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 0.25  # how often a download's progress bar is updated
LOG_SECONDS = 5.0  # how often a join logs its progress


class JoinReport:
    """A join's progress: a bar on a terminal, a log line every `LOG_SECONDS` (bytes, rate, holders, time left)."""

    def __init__(self, what: str, plan: JoinPlan) -> None:
        self.what, self.plan = what, plan
        self.most_holders, self.resumed, self.logged = 0, 0, time.monotonic()
        self._stack = contextlib.ExitStack()
        self._bar: Callable[[int, str], None] = lambda done, note: None

    def __enter__(self) -> JoinReport:
        self._bar = self._stack.enter_context(transfer(self.what, self.plan.checkpoint.blob_size))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def update(self, p: FetchProgress) -> None:
        self.most_holders, self.resumed = max(self.most_holders, p.holders), p.resumed
        self._bar(p.done, f"from {p.holders} holders")
        if time.monotonic() - self.logged >= LOG_SECONDS:
            self.logged = time.monotonic()
            left = f"{p.seconds_left:.0f}s left" if p.seconds_left is not None else "time left unknown"
            log.info(
                "joining: %s %s of %s, %s/s from %d holders, %s (%d patches to apply after it)",
                self.what,
                mb(p.done),
                mb(p.total),
                mb(int(p.rate)),
                p.holders,
                left,
                self.plan.behind,
            )


async def fetch_showing(peer: Peer, sha256: str, size: int, round_: int, what: str) -> Path:
    """`peer.fetch`, with a progress bar of the bytes received so far (on a terminal only)."""
    with progress(what, size, unit="bytes") as step:
        fetching = asyncio.ensure_future(peer.fetch(sha256, size, round_))
        shown = 0
        try:
            while not fetching.done():
                await asyncio.wait({fetching}, timeout=PROGRESS_SECONDS)
                received = peer.store.received(sha256)
                step(max(received - shown, 0))
                shown = max(shown, received)
        finally:
            fetching.cancel()  # a no-op once done; stops the fetch if this task is cancelled
        return fetching.result()


class QuietWatch:
    """Says, after `seconds` and then at doubling intervals, that nothing of the run has been found,
    with the likely reasons: a manifest other than the validator's (another run id: nothing of the
    run is ever visible), a manifest that names no validator, no `--initial-peers`."""

    def __init__(self, events: Events, peer: Peer, seconds: float) -> None:
        self.events, self.peer, self.seconds = events, peer, seconds
        self.start, self.next = time.monotonic(), seconds

    def check(self) -> None:
        waited = time.monotonic() - self.start
        if waited < self.next:
            return
        self.next *= 2
        run = self.peer.run
        if not run.validators:
            hint = "the manifest names no validator, so no round result can count: use the run's own manifest"
        else:
            hint = "is your manifest the validator's? (run ids differ when one byte differs)"
        if self.peer.alone:
            hint += "; this node was started without --initial-peers, so it knows no other peer"
        self.events.warn(
            Quiet(seconds=round(waited, 1), run_id=run.run_id, hint=hint),
            f"no validator of run {run.run_id[:8]}... seen for {waited:.0f} s: {hint}",
        )
