"""Blobs age out on every node: the last rounds' patches and payloads, the newest checkpoints
(whole: every blob of each), and never more than the disk budget."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import torch

from node.events import Events
from node.net.blobstore import BlobStore
from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.net.retention import Keeper, Retention
from node.roles.intake import RoundIntake
from node.roles.records import run_records
from node.roles.tasks import validator_for
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.identity import Identity

RUN = hashlib.sha256(b"pulse-test-retention").hexdigest()


def test_old_rounds_go_the_newest_checkpoints_stay(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    keeper = Keeper(store, Retention(keep_rounds=2, keep_checkpoints=1))
    patches = {r: store.put(f"patch {r}".encode()) for r in range(6)}
    checkpoints = {r: store.put(f"checkpoint {r}".encode()) for r in (0, 2, 4)}
    for r, sha in patches.items():
        keeper.tag(sha, r, "patch")
    for r, sha in checkpoints.items():
        keeper.tag(sha, r, "checkpoint")
    payload = store.put(b"a payload nobody tagged")
    keeper.sweep(5)
    assert set(store) == {patches[3], patches[4], patches[5], checkpoints[4], payload}
    keeper.sweep(7)  # the untagged payload was first seen in round 5: it ages like the patch of round 5
    assert set(store) == {patches[4], patches[5], payload, checkpoints[4]}  # patches since the checkpoint stay
    keeper.sweep(8)
    assert set(store) == {patches[4], patches[5], checkpoints[4]}


def test_the_disk_budget_removes_the_oldest_first_never_the_newest_checkpoint(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    keeper = Keeper(store, Retention(keep_rounds=100, keep_checkpoints=3, max_bytes=3000))
    checkpoint = store.put(b"c" * 2000)
    keeper.tag(checkpoint, 0, "checkpoint")
    patches = [store.put(bytes([r]) * 500) for r in range(4)]
    for r, sha in enumerate(patches):
        keeper.tag(sha, r + 1, "patch")
    removed = keeper.sweep(4)
    assert removed == patches[:2] and set(store) == {checkpoint, *patches[2:]}
    big = store.put(b"d" * 5000)  # alone over the budget: everything else goes, the checkpoint stays
    keeper.tag(big, 5, "patch")
    keeper.sweep(5)
    assert set(store) == {checkpoint}


def test_a_node_that_runs_for_many_rounds_keeps_a_bounded_store(tmp_path: Path) -> None:
    """Through the peer: each round's heartbeat sweeps, and what is gone is no longer announced."""
    net = MemoryNetwork(RunRecords(RUN, (), 3600.0, 2))
    peer = net.join(Identity.generate(), tmp_path / "node", role="follower")
    keep = peer.keeper.policy.keep_rounds

    async def main() -> None:
        for r in range(30):
            peer.hold(peer.store.put(f"patch {r}".encode()), r)
            if r % 2 == 0:
                peer.hold(peer.store.put(f"checkpoint {r}".encode()), r, "checkpoint")
            peer.store.put(f"payload {r}".encode())  # a miner's own payload, untagged
            net.budget.learn_head(r)  # the node read the validator's result of round r (storages refuse far rounds)
            await peer.heartbeat(r + 1, None)

    asyncio.run(main())
    kept = set(peer.store)
    assert len(kept) <= 3 * (keep + 1) + peer.keeper.policy.keep_checkpoints
    assert peer.store.path(hashlib.sha256(b"patch 29").hexdigest()).exists()
    assert not peer.store.path(hashlib.sha256(b"patch 0").hexdigest()).exists()
    assert set(peer.held) <= kept


def test_checkpoints_are_kept_whole_by_round_not_by_blob(tmp_path: Path) -> None:
    """A checkpoint is three blobs (BF16 state, piece index, FP32 master): the newest K stay whole,
    and the patches since the oldest of them (a joiner replays them from it)."""
    store = BlobStore(tmp_path)
    keeper = Keeper(store, Retention(keep_rounds=2, keep_checkpoints=2))
    groups = {}
    for c in (5, 10, 15, 20):
        groups[c] = {store.put(f"{what} {c}".encode()) for what in ("bf16", "index", "fp32")}
        for sha in groups[c]:
            keeper.tag(sha, c, "checkpoint")
    patches = {r: store.put(f"patch {r}".encode()) for r in range(8, 23)}
    for r, sha in patches.items():
        keeper.tag(sha, r, "patch")
    keeper.sweep(23)
    assert groups[15] | groups[20] <= set(store)  # the old code kept 2 blobs: fp32 and index of round 20 only
    assert not (groups[5] | groups[10]) & set(store)
    assert {patches[r] for r in range(15, 23)} <= set(store) and patches[14] not in set(store)


def test_the_validator_holds_what_its_head_names_and_its_last_checkpoints_whole(tmp_path: Path) -> None:
    """The real validator service, round after round: the FP32 master of round r (the state W_{r+1})
    is kept with the BF16 checkpoint of round r+1, and whatever the head or a heartbeat names is held."""
    me = Identity.generate()
    manifest = Manifest.model_validate(
        {"name": "t", "validators": [me.public_hex], "round": {"checkpoint_every": 1, "keep_checkpoints": 2}}
    )
    setup = RunSetup.from_manifest(manifest)
    net = MemoryNetwork(run_records(setup.manifest))
    events = Events("validator")
    intake = RoundIntake(setup, events, tmp_path / "inbox")
    peer = net.join(me, tmp_path, role="validator", intake=intake)
    service = validator_for(setup, task_for(setup), me, tmp_path, peer, events, intake)
    publisher, v = service.publisher, service.validator
    by_round: dict[int, set[str]] = {}
    step = service.validator._step

    def moving(update: dict[str, torch.Tensor] | None) -> tuple[dict[str, torch.Tensor], str]:
        """Every round moves the weights (an empty round would leave every checkpoint the same blob)."""
        return step({k: torch.full_like(v, 0.05) for k, v in service.validator.outer.fp32_state().items()})

    service.validator._step = moving  # type: ignore[method-assign]

    async def main() -> None:
        for r in range(6):
            report = service.validator.run_round([])
            publisher.store_round(report, [])
            await publisher.announce_checkpoint(r + 1, v.weights, v.state_hash)
            assert publisher.checkpoint is not None and report.result.master_checkpoint is not None
            a = publisher.checkpoint
            by_round[r + 1] = {a.blob_sha256, str(a.index_sha256), report.result.master_checkpoint.sha256}
            await peer.heartbeat(r + 1, service.validator.state_hash)
            await publisher.publish_head(r + 1, v.state_hash)
            head = await peer.head()
            assert head is not None and head.open_round == r + 1
            assert peer.store.has(head.checkpoint.blob_sha256) and peer.store.has(str(head.checkpoint.index_sha256))
            beat = await peer.validator_heartbeat(r + 1)
            assert beat is not None and all(peer.store.has(sha) for sha in beat.blobs)
            assert peer.store.has(a.blob_sha256)

    asyncio.run(main())
    held = set(peer.store)
    assert len(set().union(*by_round.values())) == 3 * len(by_round)  # distinct states, distinct blobs
    assert by_round[5] | by_round[6] <= held  # the old code kept two blobs: half of round 6's checkpoint
    assert not (by_round[1] | by_round[2] | by_round[3] | by_round[4]) & held
