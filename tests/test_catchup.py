"""`Chain`, the catch-up loop, on the in-memory network: a chain that does not continue from the newest
checkpoint is looked at again after a pause, not rejoined in a tight loop."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
import torch

from node.events import Events
from node.events.models import CheckpointLoaded
from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.roles.catchup import CHECKPOINT_FORMAT, Chain
from node.roles.chainstate import checkpoint_bytes
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
