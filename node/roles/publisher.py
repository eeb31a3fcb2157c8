"""The chain publisher: what the active validator puts on the network so that anyone can follow or join.

    publisher = ChainPublisher(setup, peer, events)
    await publisher.announce_checkpoint(r, weights, state_hash)  # BF16 blob, piece index, announcement
    await publisher.publish_head(r, state_hash)                  # `RunHead`: where the run is
    publisher.store_round(report, submissions)                   # patch, evidence, payloads: served, kept
    await publisher.publish_result(report)                       # the signed result (one retry)
    await publisher.keep_fresh(lambda: (r, state_hash))          # a task: head and results re-signed
    await publisher.republish(validator)                         # after a restart

Records live `record_ttl_seconds`, but a run and even one round may last longer: `keep_fresh`
re-publishes the head and the round results since the latest checkpoint every
`head_refresh_seconds`, so a node joining at any round finds where the run is and the whole patch
chain it needs, in a number of reads that does not grow with the round.

Retention: a round's patch and its FP32 checkpoint are held for the peer's heartbeats; the
aggregated payloads and the evidence stay fetchable for `payload_rounds` rounds (so anyone can
recompute a round), then leave the blob store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from node.events import Events, mb
from node.events.models import CheckpointAnnounced
from node.net.blobstore import BlobStore
from node.net.peer import Peer
from node.roles.catchup import CHECKPOINT_FORMAT
from node.roles.chainstate import checkpoint_bytes
from node.roles.intake import Clock
from node.run.setup import RunSetup
from protocol.errors import NetworkError
from protocol.messages import HEAD_ROUND, CheckpointAnnouncement, RoundResult, RunHead
from protocol.pieces import checkpoint_index
from protocol.signing import SignedMessage
from protocol.state import State
from validator.core import RoundReport, Validator
from validator.intake import Payload, Submission, payload_sha256

log = logging.getLogger(__name__)
HEAD_REFRESH_SECONDS = 60.0  # at most; a quarter of the record lifetime when that is shorter


def head_refresh_seconds(record_ttl_seconds: float) -> float:
    """How often the head and the results since the checkpoint are re-published: well within a record's life."""
    return min(HEAD_REFRESH_SECONDS, record_ttl_seconds / 4)


class ChainPublisher:
    def __init__(self, setup: RunSetup, peer: Peer, events: Events, *, clock: Clock = time.time) -> None:
        self.setup, self.peer, self.events, self.clock = setup, peer, events, clock
        self.checkpoint: CheckpointAnnouncement | None = None  # the latest one announced
        self.since_checkpoint: list[RoundResult] = []  # the results of the rounds since it, in order
        self.kept: dict[int, list[str]] = {}  # round -> aggregated payloads and evidence, kept fetchable
        self.refresh_seconds = head_refresh_seconds(setup.manifest.round.record_ttl_seconds)

    async def announce_checkpoint(self, r: int, weights: State, state_hash: str) -> None:
        data = checkpoint_bytes(weights)
        sha = self.peer.store.put(data)
        self.peer.hold(sha, r, "checkpoint")
        index = await asyncio.get_running_loop().run_in_executor(None, checkpoint_index, data)
        index.check_root(state_hash)  # a bug here would make every joiner refuse every piece
        index_bytes = index.to_bytes()
        index_sha = self.peer.store.put(index_bytes)
        self.peer.hold(index_sha, r, "checkpoint")
        announcement = CheckpointAnnouncement(
            run_id=self.setup.run_id,
            round=r,
            state_hash=state_hash,
            blob_sha256=sha,
            blob_size=len(data),
            format=CHECKPOINT_FORMAT,
            index_sha256=index_sha,
            index_size=len(index_bytes),
        )
        self.checkpoint, self.since_checkpoint = announcement, []  # the head names it from now on
        try:
            await self.peer.publish(announcement)
        except NetworkError as exc:  # the head names it all the same
            log.warning("checkpoint of round %d not announced: %s", r, exc)
        else:
            text = f"announced the checkpoint of round {r} ({mb(len(data))})"
            self.events.emit(CheckpointAnnounced(round=r, bytes=len(data)), text)

    async def publish_head(self, open_round: int, state_hash: str) -> None:
        if self.checkpoint is None:
            return
        head = RunHead(
            run_id=self.setup.run_id,
            round=HEAD_ROUND,
            open_round=open_round,
            state_hash=state_hash,
            checkpoint=self.checkpoint,
            validator_peer=self.peer.peer_id,
            sent_at=int(self.clock()),
        )
        try:
            await self.peer.publish(head)
        except NetworkError as exc:  # joiners search the round results meanwhile; the timer tries again
            log.warning("could not publish the run's head at round %d: %s", open_round, exc)

    async def keep_fresh(self, where: Callable[[], tuple[int, str]]) -> None:
        """Every `refresh_seconds`: the head (`where`: the open round and W_r's hash), and the results
        since the latest checkpoint (re-signed, so each gets a new lifetime)."""
        while True:
            await asyncio.sleep(self.refresh_seconds)
            await self.publish_head(*where())
            for result in list(self.since_checkpoint):
                try:
                    await self.peer.publish(result)
                except NetworkError as exc:
                    log.warning("could not refresh the result of round %d: %s", result.round, exc)

    async def publish_result(self, report: RoundReport) -> None:
        try:
            await self.peer.publish_signed(report.envelope)
        except NetworkError as exc:
            log.warning("round %d result not stored in the DHT yet (%s); retrying once", report.round, exc)
            await asyncio.sleep(1.0)
            await self.peer.publish_signed(report.envelope)
        self.since_checkpoint.append(report.result)

    def store_round(self, report: RoundReport, submissions: list[Submission]) -> None:
        """The patch, evidence and FP32 checkpoint as served blobs; the aggregated payloads copied from
        the inbox and kept for `payload_rounds` rounds (with the evidence), so anyone can recompute it."""
        hold, store, r = self.peer.hold, self.peer.store, report.round
        hold(store.put(report.patch), r)
        if report.master_checkpoint is not None:
            hold(store.put(report.master_checkpoint), r + 1, "checkpoint")  # W_{r+1}, kept with its BF16 twin
        aggregated = {s.payload_sha256 for s in report.result.selected}
        for sub in submissions:
            sha = payload_sha256(sub.payload)
            if sha in aggregated and not store.has(sha):
                _copy_in(store, sha, sub.payload)
        kept = [store.put(report.evidence), *sorted(aggregated)]
        for sha in kept:
            hold(sha, r, "payload")
        self.kept[r] = kept
        for old in [k for k in self.kept if k <= r - self.setup.manifest.round.payload_rounds]:
            for sha in self.kept.pop(old):
                store.remove(sha)

    async def republish(self, v: Validator) -> None:
        """After a restart: the last result again (DHT records may have expired or never landed), and
        the blobs it names that this validator can make again."""
        if v.last_result is None or v.last_patch is None:
            return
        last = v.round - 1
        self.peer.hold(self.peer.store.put(v.last_patch), last)
        if v.last_evidence is not None:
            self.peer.hold(self.peer.store.put(v.last_evidence), last, "payload")
        result = SignedMessage.from_bytes(v.last_result)
        named = RoundResult.from_canonical(result.body).master_checkpoint
        if named is not None and not self.peer.store.has(named.sha256):
            data = await asyncio.get_running_loop().run_in_executor(None, v.fp32_checkpoint)
            if self.peer.store.put(data) == named.sha256:  # the committed master is the state after that round
                self.peer.hold(named.sha256, v.round, "checkpoint")  # the state W_round: kept with its BF16
        await self.peer.publish_signed(v.last_result)


def _copy_in(store: BlobStore, sha256: str, payload: Payload) -> None:
    """Store `payload` (bytes, or a file read in blocks) as blob `sha256` of `store`."""
    if not isinstance(payload, Path):
        store.put(payload)
        return
    with payload.open("rb") as src, store.writer(sha256, payload.stat().st_size) as blob:
        while chunk := src.read(1 << 20):
            blob.write(chunk)
        blob.commit()
