"""A miner whose state is ready too late in a round to finish its steps before the round's target
trains the next round at once (from W_r, as overlapped training does) instead of training a round
that closes first and then starting the next one only when it opens."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import torch

from node.events import Events
from node.events.models import Event, Late, Training
from node.net.memory import MemoryNetwork
from node.roles.catchup import Held
from node.roles.miner import finishes_late
from node.roles.records import run_records
from node.roles.tasks import miner_for
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.identity import Identity
from protocol.statehash import state_hash


def test_training_that_would_end_after_the_target_is_late_only_once_measured() -> None:
    assert finishes_late(now=100.0, target=102.0, train_seconds=4.0, overlap=True)
    assert not finishes_late(now=100.0, target=105.0, train_seconds=4.0, overlap=True)
    assert not finishes_late(now=100.0, target=102.0, train_seconds=None, overlap=True)  # not measured: try
    assert not finishes_late(now=100.0, target=102.0, train_seconds=4.0, overlap=False)  # no next-round path


class LateRun:
    """A run's in-memory network and one miner on it (its folder `folder`), its events in `seen`."""

    def __init__(self, folder: Path) -> None:
        self.validator = Identity.generate()
        manifest = Manifest.model_validate({"name": "late", "validators": [self.validator.public_hex]})
        setup = RunSetup.from_manifest(manifest)
        self.net = MemoryNetwork(run_records(setup.manifest))
        me = Identity.from_seed(hashlib.sha256(b"late miner").digest())
        self.seen: list[Event] = []
        events = Events("miner")
        events.add_sink(self.seen.append)
        self.miner = miner_for(setup, task_for(setup), me, self.net.join(me, folder, role="miner"), events)
        self.weights = {k: v.to(torch.bfloat16) for k, v in task_for(setup).initial_master().items()}


def test_a_late_miner_trains_the_next_round_at_once(tmp_path: Path) -> None:
    run = LateRun(tmp_path)
    miner, weights, seen = run.miner, run.weights, run.seen

    async def main() -> None:
        assert not miner._train_ahead_instead(4, time.time() + 1.0, weights)  # no training measured yet
        miner.last_train_seconds = 5.0
        assert not miner._train_ahead_instead(4, time.time() + 60.0, weights)  # in time: round 4 it is
        assert miner._train_ahead_instead(4, time.time() + 1.0, weights)  # would end after round 4's target
        assert miner.ahead is not None and miner.ahead.round == 5
        await miner.ahead.task  # the steps for round 5, ready when it opens

    asyncio.run(main())
    assert [e.round for e in seen if isinstance(e, Late)] == [4]


def test_a_first_late_join_times_a_step_and_trains_the_next_round(tmp_path: Path) -> None:
    """A miner that never trained, its state ready just before round 4's target: it times one inner
    step, sees its steps would end after the target, and trains round 5 at once (it trained round 4,
    guessing, and lost it to "round 4 is not open")."""
    run = LateRun(tmp_path / "miner")
    miner, weights, seen = run.miner, run.weights, run.seen
    announcer = run.net.join(run.validator, tmp_path / "validator", role="validator")

    async def main() -> None:
        now = int(time.time())
        # round 4 opened 2 s ago with a 1 s target (past), its deadline still ahead: any measured time is late
        await announcer.heartbeat(4, state_hash(weights), target_seconds=1.0, sent_at=now - 2)
        await miner._mine(Held(4, weights, state_hash(weights)))
        assert miner.last_train_seconds is not None
        assert miner.ahead is not None and miner.ahead.round == 5
        await miner.ahead.task

    asyncio.run(main())
    assert [e.round for e in seen if isinstance(e, Late)] == [4]
    assert not [e for e in seen if isinstance(e, Training)]  # round 4 was not trained
