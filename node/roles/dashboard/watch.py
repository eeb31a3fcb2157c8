"""Reads the run's signed records from the DHT into a `Seen`, round by round, for the run page.

    watcher = Watcher(view, run)              # view: any `RunView` (the DHT's, a peer's, an in-memory one)
    await watcher.poll()                       # one pass: new results and metrics, heartbeats, headers
    board = watcher.board()                    # thread-safe: the HTTP server calls it from its threads

Every record arrives verified (signature, run, schema) from the view; results and metrics count
only if a validator of the run signed them. A pass reads at most `MAX_ROUNDS_PER_POLL` new
rounds, so a page opened late in a long run fills in over a few passes and stays responsive.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TypeVar

from node.net.peer import RunView
from node.roles.dashboard.board import RunBoard, RunFacts, Seen, build_board
from node.roles.forks import ForkWatch
from protocol.messages import Heartbeat, RoundMetrics, RoundResult, SubmissionHeader, WireModel

log = logging.getLogger(__name__)
M = TypeVar("M", bound=WireModel)
MAX_ROUNDS_PER_POLL = 50
METRICS_RETRY_ROUNDS = 3  # metrics are published after the result: look again for the last few rounds


class Watcher:
    def __init__(self, records: RunView, run: RunFacts, history: int = 1_000) -> None:
        self.records, self.run, self.history = records, run, history
        self.seen = Seen()
        self.next_round: int | None = None  # the first round whose result has not been read
        self.lock = threading.Lock()
        self._cached: tuple[tuple[int, int], RunBoard] | None = None
        self._fork_watch = ForkWatch()

    def board(self, now: float | None = None) -> RunBoard:
        """The board now; rebuilt only when a record arrived or a second passed (pages refresh often)."""
        now = time.time() if now is None else now
        with self.lock:
            key = (self.seen.version, int(now))
            if self._cached is None or self._cached[0] != key:
                self._cached = (key, build_board(self.run, self.seen, now))
            return self._cached[1]

    async def run_forever(self, interval: float) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(interval)

    async def poll(self) -> None:
        if self.next_round is None:  # first pass: start `history` rounds back from the latest result
            self.next_round = max(0, await self.records.latest_result_round(0) + 1 - self.history)
        new: list[int] = []
        while len(new) < MAX_ROUNDS_PER_POLL:
            result = await self._from_validator(RoundResult, self.next_round)
            if result is None or self._forks(result):
                break
            with self.lock:
                self.seen.add_result(result)
            new.append(self.next_round)
            self.next_round += 1
        await self._metrics(new)
        current = self.next_round
        for r in (current - 1, current):
            for beat in await self.records.get(Heartbeat, r):
                by_validator = beat.sender_hex in self.run.validators
                with self.lock:
                    self.seen.add_heartbeat(beat.sender_hex, beat.message, from_validator=by_validator)
        headers = await self.records.get(SubmissionHeader, current)
        with self.lock:
            for header in headers:
                self.seen.add_header(header.message)

    def _forks(self, result: RoundResult) -> bool:
        """Whether `result` forks from the chain read so far (`forks.py`): the page stays on the first."""
        before = self.seen.results.get(result.round - 1)
        return self._fork_watch.forks(result, None if before is None else before.new_state_hash)

    async def _metrics(self, new: list[int]) -> None:
        """Metrics of the rounds just read, and again of the last few that still lack them (a validator
        publishes them after the result); older gaps stay gaps."""
        assert self.next_round is not None
        window = range(max(0, self.next_round - METRICS_RETRY_ROUNDS), self.next_round)
        with self.lock:
            wanted = sorted({*new, *window} - set(self.seen.metrics))
        for r in wanted:
            metrics = await self._from_validator(RoundMetrics, r)
            if metrics is not None:
                with self.lock:
                    self.seen.add_metrics(metrics)

    async def _from_validator(self, kind: type[M], round_: int) -> M | None:
        for verified in await self.records.get(kind, round_):
            if verified.sender_hex in self.run.validators:
                return verified.message
        return None
