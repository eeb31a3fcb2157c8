"""How a node with no weights joins: which checkpoint, which patches, and the bytes each choice costs.

    plan = await plan_join(peer, current, head.checkpoint)   # None until a checkpoint is announced

A joiner needs W_current. It can load any announced checkpoint W_c (c <= current) and apply the
patches of rounds c .. current-1. Checkpoints are dense and patches sparse, so the newest
checkpoint is usually cheapest, but not always: a download of an older checkpoint interrupted at
90% (kept on disk, `net/pieces.py`) plus a few small patches costs less than a fresh copy of the
newest. So every checkpoint the validator announced within the last two checkpoint periods is
priced by the bytes still to fetch (checkpoint minus what is on disk, its piece index, the
patches not already held) and the cheapest wins; a tie goes to the newer one (fewer patches to apply).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from node.net.peer import Peer
from node.net.pieces import resumable_bytes
from protocol.messages import CheckpointAnnouncement, RoundResult


@dataclass(frozen=True)
class JoinPlan:
    checkpoint: CheckpointAnnouncement
    patches: tuple[tuple[int, str, int], ...]  # (round, patch sha256, size) of rounds c .. current-1
    bytes_needed: int  # what is still to fetch
    bytes_total: int  # checkpoint, index and patches, whatever is on disk already
    complete: bool = True  # its patches lead to W_current (else the chain breaks after them)

    @property
    def behind(self) -> int:
        return len(self.patches)


async def plan_join(
    peer: Peer, current: int, known: CheckpointAnnouncement | None = None, skip: frozenset[str] = frozenset()
) -> JoinPlan | None:
    """The cheapest way to W_current by bytes still to fetch; None if no usable checkpoint is announced.

    `known` is a checkpoint already found (the run head's): priced even when its own record is gone.
    Only checkpoints the validator still keeps are priced (its newest `keep_checkpoints`, of which
    the head's is the newest), never one in `skip` (blobs no holder delivered) unless it is `known`.
    """
    lookback = 2 * peer.run.checkpoint_every + 1
    rounds = range(max(0, current - lookback), current + 1)
    found = await asyncio.gather(*(peer.from_validator(CheckpointAnnouncement, r) for r in rounds))
    unique = {a.round: a for a in [*found, known] if a is not None and a.round <= current}
    newest = sorted(unique)[-peer.run.keep_checkpoints :]
    checkpoints = [unique[r] for r in newest if unique[r] == known or unique[r].blob_sha256 not in skip]
    if not checkpoints:
        return None
    oldest = min(a.round for a in checkpoints)
    results = await asyncio.gather(*(peer.round_result(r) for r in range(oldest, current)))
    by_round = {oldest + i: r for i, r in enumerate(results)}
    plans = [_price(peer, a, current, by_round) for a in checkpoints]
    # a plan whose chain breaks is taken only when none leads to W_current: the newest checkpoint
    # then (the chain may be repaired later; `Chain` pauses before it rejoins)
    return min(plans, key=lambda p: (not p.complete, p.bytes_needed if p.complete else -p.checkpoint.round))


def _price(peer: Peer, a: CheckpointAnnouncement, current: int, results: dict[int, RoundResult | None]) -> JoinPlan:
    patches = []
    state = a.state_hash
    complete = True
    for r in range(a.round, current):
        result = results.get(r)
        if result is None or result.base_state_hash != state:
            complete = False  # a gap or a fork in the chain after this checkpoint: it does not lead to W_current
            break
        patches.append((r, result.patch_sha256, result.patch_size))
        state = result.new_state_hash
    store = peer.store
    held = a.blob_size if store.has(a.blob_sha256) else resumable_bytes(store, a.blob_sha256)
    index = a.index_size or 0
    needed = max(a.blob_size - held, 0) + (0 if a.index_sha256 and store.has(a.index_sha256) else index)
    needed += sum(size for _, sha, size in patches if not store.has(sha))
    total = a.blob_size + index + sum(size for _, _, size in patches)
    return JoinPlan(a, tuple(patches), needed, total, complete)
