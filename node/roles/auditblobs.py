"""The blobs an auditor works from: a round's evidence, its aggregated payloads and its patch, fetched
from the validators or any holder, then re-served for `keep_payload_rounds` rounds (`auditor.py`).

    blobs = RoundBlobs(peer, keep=manifest.round.payload_rounds)
    evidence, payloads, patch = await blobs.inputs(result)   # TransferError: not fetchable yet
    blobs.serve(result, report.patch, evidence, payloads)    # once the round recomputes
"""

from __future__ import annotations

import asyncio
import logging

from node.net.peer import Peer
from protocol.errors import ProtocolError, TransferError
from protocol.messages import BlobRef, RoundResult
from validator.evidence import RoundEvidence

log = logging.getLogger(__name__)


class RoundBlobs:
    def __init__(self, peer: Peer, *, keep: int) -> None:
        self.peer, self.keep = peer, keep
        self.kept: dict[int, list[str]] = {}  # round -> payload and evidence blobs re-served

    async def fetch(self, blob: BlobRef, round_: int) -> bytes:
        path = await self.peer.fetch(blob.sha256, blob.size, round_)
        return await asyncio.get_running_loop().run_in_executor(None, path.read_bytes)

    async def inputs(self, result: RoundResult) -> tuple[bytes, dict[str, bytes], bytes | None]:
        """(evidence, aggregated payloads by hash, the patch or None if nobody serves it)."""
        r = result.round
        evidence = await self.fetch(result.evidence, r)
        payloads: dict[str, bytes] = {}
        try:
            listed = RoundEvidence.from_bytes(evidence).aggregated
        except ProtocolError:
            listed = ()  # the audit reports the evidence itself
        for entry in listed:
            blob = BlobRef(sha256=entry.payload_sha256, size=entry.payload_size)
            payloads[entry.payload_sha256] = await self.fetch(blob, r)
        try:
            patch: bytes | None = await self.fetch(BlobRef(sha256=result.patch_sha256, size=result.patch_size), r)
        except TransferError as exc:
            log.info("round %d: the patch is not fetchable (%s); re-encoding it", r, exc)
            patch = None
        return evidence, payloads, patch

    def serve(self, result: RoundResult, patch: bytes | None, evidence: bytes, payloads: dict[str, bytes]) -> None:
        """Re-serve the round's patch, evidence and payloads; payloads and evidence of old rounds go."""
        if patch is not None:
            self.peer.hold(self.peer.store.put(patch), result.round)
        kept = [self.peer.store.put(evidence), *(self.peer.store.put(p) for p in payloads.values())]
        for sha in kept:
            self.peer.hold(sha, result.round, "payload")
        self.kept[result.round] = kept
        for old in [r for r in self.kept if r <= result.round - self.keep]:
            for sha in self.kept.pop(old):
                self.peer.store.remove(sha)
