"""A joiner prices only the checkpoints the validator still keeps (its newest `keep_checkpoints`),
and does not plan again one that no holder delivered, unless the head names it: a restarted miner
retried a deleted checkpoint 25 times before it rejoined."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.roles.catchup import CHECKPOINT_FORMAT
from node.roles.joinplan import plan_join
from protocol.identity import Identity
from protocol.messages import CheckpointAnnouncement, RoundResult
from tests.helpers import commitments

RUN = hashlib.sha256(b"pulse-test-joinplan-kept").hexdigest()
VALIDATOR = Identity.from_seed(hashlib.sha256(b"joinplan-kept validator").digest())


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_only_kept_checkpoints_are_planned_and_a_failed_one_not_again(tmp_path: Path) -> None:
    net = MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, checkpoint_every=2, keep_checkpoints=2))
    validator = net.join(VALIDATOR, tmp_path / "v", role="validator")
    joiner = net.join(Identity.generate(), tmp_path / "j", role="miner")
    size = 1000  # a checkpoint costs far more than a few patches
    blobs = {c: hashlib.sha256(bytes([c]) * size).hexdigest() for c in (0, 2)}
    joiner.store.put(bytes([0]) * size)  # round 0's checkpoint is on the joiner's disk (from an earlier run)
    announced = {
        c: CheckpointAnnouncement(
            run_id=RUN,
            round=c,
            state_hash=h(f"w{c}"),
            blob_sha256=blobs.get(c, h(f"blob {c}")),
            blob_size=size,
            format=CHECKPOINT_FORMAT,
        )
        for c in (0, 2, 4)
    }
    results = [
        RoundResult(
            run_id=RUN,
            round=r,
            selected=(),
            rejections=(),
            base_state_hash=h(f"w{r}"),
            patch_sha256=h(f"p{r}"),
            patch_size=10,
            new_state_hash=h(f"w{r + 1}"),
            **commitments(str(r)),
        )
        for r in range(5)
    ]

    async def main() -> None:
        for message in [*announced.values(), *results]:
            await validator.publish(message)
        plan = await plan_join(joiner, 5, announced[4])
        assert plan is not None and plan.checkpoint.round == 4  # round 0's is the cheapest, but no longer kept
        joiner.store.put(bytes([2]) * size)
        plan = await plan_join(joiner, 5, announced[4])
        assert plan is not None and plan.checkpoint.round == 2  # kept, on disk: the cheapest
        plan = await plan_join(joiner, 5, announced[4], skip=frozenset({blobs[2]}))
        assert plan is not None and plan.checkpoint.round == 4  # round 2's failed: the head's then
        plan = await plan_join(joiner, 5, announced[4], skip=frozenset({announced[4].blob_sha256, blobs[2]}))
        assert plan is not None and plan.checkpoint.round == 4  # the head's is always planned

    asyncio.run(main())
