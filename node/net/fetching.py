"""Fetching one blob from many claimed holders: who to ask first, and asking more than one.

    book = HolderBook()
    path = await fetch_first(holders, attempt, book=book, trusted={validator}, deadline=..., hedge_after=2.0)

Anyone can claim to hold a blob (a heartbeat costs nothing), and a fake holder that goes silent
or trickles would cost a fetcher `open_timeout + size / min_rate` if holders were tried one after
another. So:

- order: the trusted holders (the run's validators), then holders that delivered before (the
  most recent first), then the others in random order, then those that failed recently;
- hedging: the first attempt starts at once; one more starts whenever one fails, and every
  `hedge_after` seconds unless a body arrives at `hedge_rate` or faster (a silent, trickling or
  stalled holder is raced, a fast one is not), with at most `MAX_FLOWING` bodies at once. The
  first verified blob wins and the others are cancelled;
- a holder that answers BUSY is asked again (after `BUSY_PAUSE_SECONDS`, doubling, at most
  `BUSY_RETRIES` times) rather than counted as failed: when the only real holder is busy, the
  fetch waits for its slot instead of failing;
- one deadline for the blob, whatever the number of holders;
- the book remembers who delivered and who failed, for the next blobs. It is bounded: a flood of
  fresh peer ids pushes out the oldest entries, never grows it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path

from protocol.errors import PeerBusy, ProtocolError, TransferError, TransferTimeout

log = logging.getLogger(__name__)

Progress = Callable[[], int]
"""Bytes of a body received so far."""
Attempt = Callable[[str, Callable[[Progress], None]], Awaitable[Path]]
"""Fetch from one holder; call the callback with a progress probe once its body starts to arrive."""
MAX_FLOWING = 4  # bodies received at once for one blob
BUSY_RETRIES = 6  # times one holder that answered BUSY is asked again for one blob
BUSY_PAUSE_SECONDS = (0.5, 8.0)  # first pause before asking a busy holder again, longest pause


class HolderBook:
    """What this node learned of holders: when each last delivered and last failed."""

    def __init__(
        self,
        capacity: int = 1024,
        forget_failures_after: float = 600.0,
        on_delivered: Callable[[str], None] | None = None,  # e.g. grant the holder standing (`budget.py`)
    ) -> None:
        self.capacity, self.forget_failures_after, self.on_delivered = capacity, forget_failures_after, on_delivered
        self._delivered: OrderedDict[str, float] = OrderedDict()
        self._failed: OrderedDict[str, float] = OrderedDict()

    def delivered(self, holder: str) -> None:
        self._failed.pop(holder, None)
        self._note(self._delivered, holder)
        if self.on_delivered is not None:
            self.on_delivered(holder)

    def failed(self, holder: str) -> None:
        self._note(self._failed, holder)

    def order(self, holders: Sequence[str], trusted: Collection[str] = ()) -> list[str]:
        """`holders` (deduplicated) in the order to try them (see the module docstring)."""
        now = time.monotonic()
        unique = list(dict.fromkeys(holders))
        failed = {h for h in unique if now - self._failed.get(h, -float("inf")) < self.forget_failures_after}
        first = [h for h in unique if h in trusted and h not in failed]
        proven = sorted(
            (h for h in unique if h in self._delivered and h not in failed and h not in trusted),
            key=lambda h: -self._delivered[h],
        )
        unknown = [h for h in unique if h not in self._delivered and h not in failed and h not in trusted]
        random.shuffle(unknown)
        last = sorted(failed, key=lambda h: self._failed[h])
        return [*first, *proven, *unknown, *last]

    def _note(self, book: OrderedDict[str, float], holder: str) -> None:
        book.pop(holder, None)
        book[holder] = time.monotonic()
        while len(book) > self.capacity:
            book.popitem(last=False)


async def fetch_first(
    holders: Sequence[str],
    attempt: Attempt,
    *,
    book: HolderBook,
    sha256: str,
    deadline: float,
    hedge_after: float,
    hedge_rate: float,
    trusted: Collection[str] = (),
) -> Path:
    """The blob from whichever holder delivers it first, by `deadline` (a `time.monotonic()` time).

    `TransferError` naming every failure if none delivers; `TransferTimeout` at the deadline.
    """
    order = book.order(holders, trusted)
    if not order:
        raise TransferError(f"no holders of {sha256[:12]}...")
    race = _Race(order, attempt, book, hedge_after, hedge_rate)
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            return await race.run()
    except TimeoutError as exc:
        raise TransferTimeout(f"no holder delivered {sha256[:12]}... in time ({race.summary()})") from exc
    finally:
        await race.cancel()


class _Race:
    """Attempts started one after another (hedged), the first success wins."""

    def __init__(self, order: list[str], attempt: Attempt, book: HolderBook, hedge_after: float, rate: float) -> None:
        self.waiting, self.attempt, self.book = list(order), attempt, book
        self.hedge_after, self.rate = hedge_after, rate
        self.running: dict[asyncio.Task[Path], str] = {}
        self.flowing: dict[str, tuple[float, Progress]] = {}  # holder -> (body started at, bytes so far)
        self.failures: list[str] = []
        self.busy: dict[str, int] = {}  # holder -> BUSY answers so far
        self.later: list[tuple[float, str]] = []  # (monotonic time, holder): busy holders to ask again

    async def run(self) -> Path:
        self._start_next()
        while self.running or self.later:
            if not self.running:  # only busy holders left: wait for the first to be due
                await asyncio.sleep(max(0.0, self.later[0][0] - time.monotonic()))
                self._due()
                continue
            done, _ = await asyncio.wait(self.running, timeout=self._wait(), return_when=asyncio.FIRST_COMPLETED)
            self._due()
            if not done:
                if self._should_hedge():
                    self._start_next()
                continue
            for task in done:
                holder = self.running.pop(task)
                self.flowing.pop(holder, None)
                failure = task.exception()
                if failure is None:
                    self.book.delivered(holder)
                    return task.result()
                if not isinstance(failure, (TransferError, ProtocolError)):
                    raise failure
                log.info("fetch from %s failed: %s", holder, failure)
                if not (isinstance(failure, PeerBusy) and self._again_later(holder)):
                    self.book.failed(holder)
                self.failures.append(f"{holder}: {failure}")
            self._start_next()  # a failure: the next holder at once
        raise TransferError(f"no holder delivered ({self.summary()})")

    def _again_later(self, holder: str) -> bool:
        """Ask a busy `holder` again after a pause, unless it was busy too often already."""
        answers = self.busy[holder] = self.busy.get(holder, 0) + 1
        if answers > BUSY_RETRIES:
            return False
        first, longest = BUSY_PAUSE_SECONDS
        pause = min(first * 2 ** (answers - 1), longest) * random.uniform(0.75, 1.25)  # spread many fetchers
        self.later.append((time.monotonic() + pause, holder))
        self.later.sort()
        return True

    def _due(self) -> None:
        """Busy holders whose pause is over go first in line; one starts now unless a body flows fast."""
        now, due = time.monotonic(), []
        while self.later and self.later[0][0] <= now:
            due.append(self.later.pop(0)[1])
        if due:
            self.waiting[:0] = due
            if not self.running or self._should_hedge():
                self._start_next()

    def _wait(self) -> float:
        return min([self.hedge_after] + [max(0.0, at - time.monotonic()) for at, _ in self.later[:1]])

    def _should_hedge(self) -> bool:
        """No body arrives fast enough, and there is room for one more."""
        now = time.monotonic()
        fast = any(got() >= self.rate * max(now - started, 1e-3) for started, got in self.flowing.values())
        return not fast and len(self.flowing) < MAX_FLOWING

    def _start_next(self) -> None:
        if not self.waiting:
            return
        holder = self.waiting.pop(0)

        def on_body(progress: Progress) -> None:
            self.flowing[holder] = (time.monotonic(), progress)

        self.running[asyncio.ensure_future(self.attempt(holder, on_body))] = holder

    def summary(self) -> str:
        pending = [f"{h}: no answer yet" for h in self.running.values()]
        return "; ".join(self.failures + pending)[:2000] or "no holders"

    async def cancel(self) -> None:
        for task in self.running:
            task.cancel()
        if self.running:
            await asyncio.wait(self.running)  # each attempt removes its temp file on the way out
        for task in self.running:
            if not task.cancelled() and task.exception() is not None:
                log.debug("a cancelled fetch ended with: %s", task.exception())
