"""`Chain`, the catch-up loop, on the in-memory network: a chain that does not continue from the newest
checkpoint is looked at again after a pause, not rejoined in a tight loop."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

import pytest
import torch

from node.events import Events
from node.events.models import CheckpointLoaded
from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.roles.catchup import CHECKPOINT_FORMAT, Chain
from node.roles.chainstate import checkpoint_bytes
from protocol import pulsesync
from protocol.identity import Identity
from protocol.messages import CheckpointAnnouncement, RoundResult
from protocol.statehash import state_hash
from tests.helpers import commitments

RUN = hashlib.sha256(b"pulse-test-catchup").hexdigest()
VALIDATOR = Identity.generate()


class Counting(Events):
    def __init__(self) -> None:
        super().__init__("follow")
        self.loads = 0

    def emit(self, event: object, text: str) -> None:  # type: ignore[override]
        self.loads += isinstance(event, CheckpointLoaded)


def test_a_chain_broken_at_the_newest_checkpoint_waits_before_rejoining(tmp_path: Path) -> None:
    net = MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5))
    validator = net.join(VALIDATOR, tmp_path / "validator", role="validator")
    follower = net.join(Identity.generate(), tmp_path / "follower", role="follower")
    weights = {"w": torch.ones(4, 4, dtype=torch.bfloat16)}
    data = checkpoint_bytes(weights)
    sha = validator.store.put(data)
    validator.hold(sha, 0, "checkpoint")
    checkpoint = CheckpointAnnouncement(
        run_id=RUN, round=0, state_hash=state_hash(weights), blob_sha256=sha, blob_size=len(data),
        format=CHECKPOINT_FORMAT,
    )  # fmt: skip
    elsewhere = RoundResult(
        run_id=RUN, round=0, selected=(), rejections=(), base_state_hash="1" * 64, patch_sha256="2" * 64,
        patch_size=10, new_state_hash="3" * 64, **commitments(),
    )  # fmt: skip
    events = Counting()
    chain = Chain(follower, events, poll=0.1)

    async def main() -> None:
        await validator.heartbeat(0, checkpoint.state_hash)
        await validator.publish(checkpoint)
        await validator.publish(elsewhere)
        with pytest.raises(TimeoutError):  # never returns: the chain never continues
            await asyncio.wait_for(chain.sync(), 0.5)

    asyncio.run(main())
    assert 1 <= events.loads <= 6  # one load per pause, not thousands


def test_a_follower_stays_on_the_chain_it_follows_and_names_a_fork(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A second process signing with the validator's key publishes round 1 from another state: the
    follower keeps the state it reached by round 0's patch, says so once, and goes on with its chain."""
    net = MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5))
    validator = net.join(VALIDATOR, tmp_path / "validator", role="validator")
    follower = net.join(Identity.generate(), tmp_path / "follower", role="follower")
    states = [{"w": torch.full((4, 4), float(i), dtype=torch.bfloat16)} for i in range(3)]
    hashes = [state_hash(s) for s in states]
    data = checkpoint_bytes(states[0])
    sha = validator.store.put(data)
    validator.hold(sha, 0, "checkpoint")
    checkpoint = CheckpointAnnouncement(
        run_id=RUN, round=0, state_hash=hashes[0], blob_sha256=sha, blob_size=len(data), format=CHECKPOINT_FORMAT,
    )  # fmt: skip

    def result(r: int, base: str) -> RoundResult:
        patch = pulsesync.encode(states[r], states[r + 1], old_hash=hashes[r], new_hash=hashes[r + 1])
        patch_sha = validator.store.put(patch)
        validator.hold(patch_sha, r)
        return RoundResult(
            run_id=RUN, round=r, selected=(), rejections=(), base_state_hash=base, patch_sha256=patch_sha,
            patch_size=len(patch), new_state_hash=hashes[r + 1], **commitments(),
        )  # fmt: skip

    events = Counting()
    chain = Chain(follower, events, poll=0.05)

    async def main() -> None:
        for r in range(3):  # holders are looked for at the round the run is at
            await validator.heartbeat(r, hashes[0])
        await validator.publish(checkpoint)
        await validator.publish(result(0, hashes[0]))
        await validator.publish(result(1, "1" * 64))  # the second chain
        with caplog.at_level(logging.WARNING):
            assert (await asyncio.wait_for(chain.sync(), 10)).round == 1
            assert (await asyncio.wait_for(chain.sync(), 10)).round == 1
        await validator.publish(result(1, hashes[1]))  # the first chain goes on
        held = await asyncio.wait_for(chain.sync(), 10)
        assert (held.round, held.state_hash) == (2, hashes[2])

    asyncio.run(main())
    assert events.loads == 1  # never rejoined
    forks = [rec.getMessage() for rec in caplog.records if "fork" in rec.getMessage()]
    assert len(forks) == 1 and "round 1" in forks[0] and "1" * 12 in forks[0] and hashes[1][:12] in forks[0], forks


def test_a_checkpoint_no_holder_delivers_is_tried_again_less_and_less_often(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node started after its run ended finds the last announcement but no holder that answers:
    it keeps trying (a restarting validator comes back), each wait twice the last, and says why."""
    net = MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5))
    validator = net.join(VALIDATOR, tmp_path / "validator", role="validator")
    follower = net.join(Identity.generate(), tmp_path / "follower", role="follower")
    weights = {"w": torch.ones(4, 4, dtype=torch.bfloat16)}
    data = checkpoint_bytes(weights)
    checkpoint = CheckpointAnnouncement(
        run_id=RUN, round=0, state_hash=state_hash(weights), blob_sha256=hashlib.sha256(data).hexdigest(),
        blob_size=len(data), format=CHECKPOINT_FORMAT,
    )  # fmt: skip  # announced, but nobody stores the blob: every holder is gone
    chain = Chain(follower, Counting(), poll=0.05)

    async def main() -> None:
        await validator.heartbeat(0, checkpoint.state_hash)
        await validator.publish(checkpoint)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(chain.sync(), 1.2)

    with caplog.at_level(logging.WARNING, logger="node.roles.catchup"):
        asyncio.run(main())
    tries = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
    assert 3 <= len(tries) <= 6, tries  # 0.05, 0.1, 0.2, 0.4 s apart; at the poll alone it would be 20
    assert tries[0].startswith("checkpoint of round 0 unusable (try 1,") and "every holder gone" in tries[-1]
