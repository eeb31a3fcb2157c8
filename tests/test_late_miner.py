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
from node.events.models import Event, Late
from node.net.memory import MemoryNetwork
from node.roles.miner import finishes_late
from node.roles.records import run_records
from node.roles.tasks import miner_for
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.identity import Identity


def test_training_that_would_end_after_the_target_is_late_only_once_measured() -> None:
    assert finishes_late(now=100.0, target=102.0, train_seconds=4.0, overlap=True)
    assert not finishes_late(now=100.0, target=105.0, train_seconds=4.0, overlap=True)
    assert not finishes_late(now=100.0, target=102.0, train_seconds=None, overlap=True)  # not measured: try
    assert not finishes_late(now=100.0, target=102.0, train_seconds=4.0, overlap=False)  # no next-round path


def test_a_late_miner_trains_the_next_round_at_once(tmp_path: Path) -> None:
    validator = Identity.generate()
    setup = RunSetup.from_manifest(Manifest.model_validate({"name": "late", "validators": [validator.public_hex]}))
    net = MemoryNetwork(run_records(setup.manifest))
    me = Identity.from_seed(hashlib.sha256(b"late miner").digest())
    seen: list[Event] = []
    events = Events("miner")
    events.add_sink(seen.append)
    miner = miner_for(setup, task_for(setup), me, net.join(me, tmp_path, role="miner"), events)
    weights = {k: v.to(torch.bfloat16) for k, v in task_for(setup).initial_master().items()}

    async def main() -> None:
        assert not miner._train_ahead_instead(4, time.time() + 1.0, weights)  # no training measured yet
        miner.last_train_seconds = 5.0
        assert not miner._train_ahead_instead(4, time.time() + 60.0, weights)  # in time: round 4 it is
        assert miner._train_ahead_instead(4, time.time() + 1.0, weights)  # would end after round 4's target
        assert miner.ahead is not None and miner.ahead[0] == 5
        await miner.ahead[1]  # the steps for round 5, ready when it opens

    asyncio.run(main())
    assert [e.round for e in seen if isinstance(e, Late)] == [4]
