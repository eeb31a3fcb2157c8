"""Ctrl+C while a validator decides a round: the round's thread stops before its next payload, so the
process exits in one evaluation's time, not after the rest of the round (minutes at a real size),
and nothing of the stopped round is kept: reopened, the validator decides it as if never stopped."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from node.bench.arena import Arena
from node.roles.validator_service import ValidatorService
from tests.fakeswarm import CountingEvaluator, make_swarm
from tests.test_validator_service import _open, _service
from validator.core import SPILL_FOLDER, RoundReport, Validator
from validator.gauntlet import RoundStopped
from validator.scoring import Batch, Evaluator


class StopAfter(CountingEvaluator):
    """A counting evaluator that sets `stopping` at its `calls`-th loss (0: never)."""

    def __init__(self, inner: Evaluator, calls: int, stopping: threading.Event) -> None:
        super().__init__(inner)
        self.calls, self.stopping = calls, stopping

    def loss(self, batch: Batch) -> float:
        out = super().loss(batch)
        if self.losses == self.calls:
            self.stopping.set()
        return out


def test_a_stopped_round_keeps_nothing_and_decides_the_same_when_run_again(tmp_path: Path) -> None:
    swarm = make_swarm()
    arena = Arena(swarm.validator(tmp_path / "v"), swarm.honest(3))
    subs, _, _ = arena.submissions()
    v = arena.validator
    round_, state = v.round, v.state_hash
    probe = StopAfter(v.evaluator, swarm.cfg.random_batches, v.stopping)  # the last loss at W_r, on R
    v.evaluator = probe
    with pytest.raises(RoundStopped):
        v.run_round(subs)
    assert (v.round, v.state_hash) == (round_, state)
    assert not (tmp_path / "v" / SPILL_FOLDER).exists()

    w = swarm.validator(tmp_path / "w")
    counted = StopAfter(w.evaluator, 0, w.stopping)  # never stops: counts a whole round's evaluations
    w.evaluator = counted
    never_stopped = w.run_round(subs)
    assert probe.evaluations == 0 < counted.evaluations  # not one update evaluated after the stop

    reopened = swarm.reopen(tmp_path / "v")
    assert (reopened.round, reopened.state_hash) == (round_, state)
    again = reopened.run_round(subs)
    assert again.envelope == never_stopped.envelope and again.patch == never_stopped.patch


def test_ctrl_c_while_the_validator_decides_stops_its_thread(tmp_path: Path) -> None:
    """The service tells the round to stop when its task is cancelled (what Ctrl+C does)."""
    _, service = _service(tmp_path)
    _open(service)
    started, ended = threading.Event(), threading.Event()

    def decide_for_ever(v: Validator) -> RoundReport:
        started.set()
        if not v.stopping.wait(20):
            raise RuntimeError("the round was never told to stop")
        ended.set()
        raise RoundStopped("stopped")

    service.validator.run_round = lambda _subs: decide_for_ever(service.validator)  # type: ignore[method-assign]

    async def main(s: ValidatorService) -> None:
        task = asyncio.ensure_future(s._close())
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    begun = time.monotonic()
    asyncio.run(main(service))  # returns once the round's thread has ended (it waits for the executor)
    assert ended.is_set() and time.monotonic() - begun < 10
