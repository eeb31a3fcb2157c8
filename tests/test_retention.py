"""Blobs age out on every node: the last rounds' patches and payloads, the newest checkpoints,
and never more than the disk budget."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from node.net.blobstore import BlobStore
from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.net.retention import Keeper, Retention
from protocol.identity import Identity

RUN = hashlib.sha256(b"pulse-test-retention").hexdigest()


def test_old_rounds_go_the_newest_checkpoints_stay(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    keeper = Keeper(store, Retention(keep_rounds=2, keep_checkpoints=2))
    patches = {r: store.put(f"patch {r}".encode()) for r in range(6)}
    checkpoints = {r: store.put(f"checkpoint {r}".encode()) for r in (0, 2, 4)}
    for r, sha in patches.items():
        keeper.tag(sha, r, "patch")
    for r, sha in checkpoints.items():
        keeper.tag(sha, r, "checkpoint")
    payload = store.put(b"a payload nobody tagged")
    keeper.sweep(5)
    assert set(store) == {patches[3], patches[4], patches[5], checkpoints[2], checkpoints[4], payload}
    keeper.sweep(7)  # the untagged payload was first seen in round 5: it ages like the patch of round 5
    assert set(store) == {patches[5], payload, checkpoints[2], checkpoints[4]}
    keeper.sweep(8)
    assert set(store) == {checkpoints[2], checkpoints[4]}


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
            await peer.heartbeat(r + 1, None)

    asyncio.run(main())
    kept = set(peer.store)
    assert len(kept) <= 3 * (keep + 1) + peer.keeper.policy.keep_checkpoints
    assert peer.store.path(hashlib.sha256(b"patch 29").hexdigest()).exists()
    assert not peer.store.path(hashlib.sha256(b"patch 0").hexdigest()).exists()
    assert set(peer.held) <= kept
