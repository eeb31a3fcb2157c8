"""A round's blobs on a standby before the active validator publishes them: replication both ways.

    sent = await replicate(peer, setup, me, r, envelope, events)   # the active validator, before publishing
    peer.take_replicas(ReplicaTaker(...).on_replica)              # a standby validator

Why: a standby can take the next round over only once it has verified the new state, and for that
it needs the round's evidence, aggregated payloads and patch. If the active validator published its
result and died before anyone fetched them, nobody could verify (or serve) that state, and the run
would wait for it to come back. So before publishing, the active validator hands the signed result
to every standby that announced the round (`rpc_replicate`, `node/net/transfer.py`); each standby
fetches the blobs it names from that validator (hash-checked, sizes capped), keeps and announces
them as it would an audited round's, and answers OK. The active validator publishes once one
standby has answered OK, or after `round.replicate_seconds`, or at once with no standby.

What a standby checks before fetching anything (each refusal is logged with its reason, and a
refused replica leaves nothing behind): the envelope is a round result of this run, signed by the
validator that is active for that round by the chain rule (the signer of the counted result of the
round before; the first in the manifest for round 0), for the round this standby holds and from the
state it holds; the patch, evidence and payloads are within their caps and their number within
`max_submissions`. The blobs are fetched from the pushing peer only, each against the hash and size
the result (or its evidence) names, so a replica can only ever add the very bytes the result commits to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from node.events import Events
from node.events.audit import Replicated
from node.net.peer import Peer
from node.net.streams import STREAM_ERRORS
from node.run.setup import RunSetup
from protocol.codec import default_max_bytes
from protocol.errors import NetworkError, ProtocolError, TransferError
from protocol.messages import RoundResult
from protocol.signing import open_signed
from validator.audit import Replica
from validator.evidence import MAX_EVIDENCE_BYTES, RoundEvidence

log = logging.getLogger(__name__)


async def replicate(peer: Peer, setup: RunSetup, me: str, r: int, envelope: bytes, events: Events) -> int:
    """Before publishing round r's result: hand it to the standbys that announced round r, until one
    holds its blobs or `replicate_wait` passes. Returns how many acknowledged (0 with no standby)."""
    if len(setup.manifest.validators) < 2:
        return 0
    standbys = [b.message.peer_id for b in await peer.validator_heartbeats(r) if b.sender_hex != me]
    if not standbys:
        return 0
    wait, start = setup.manifest.round.replicate_wait, time.monotonic()
    pushes = {asyncio.ensure_future(peer.replicate(envelope, to=p, wait=wait)): p for p in standbys}
    acked, refusals = 0, []
    pending = set(pushes)
    try:
        while pending and not acked:
            done, pending = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break  # none answered in time
            for push in done:
                try:
                    push.result()
                    acked += 1
                except (ProtocolError, NetworkError, *STREAM_ERRORS) as exc:
                    refusals.append(f"{pushes[push][:16]}: {exc}")
    finally:
        for push in pending:  # a standby still fetching keeps going on its side
            push.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    seconds = time.monotonic() - start
    text = (
        f"round {r}: {acked} of {len(standbys)} standbys hold the result's blobs ({seconds:.1f} s)"
        + (f"; refused: {'; '.join(refusals)}" if refusals else "")
        + ("" if acked else "; publishing anyway")
    )
    events.emit(Replicated(round=r, standbys=len(standbys), acknowledged=acked, seconds=seconds), text)
    return acked


class ReplicaTaker:
    """A standby's side: take a replica of the round it holds from the validator active for it."""

    def __init__(
        self,
        setup: RunSetup,
        peer: Peer,
        me: str,
        held: Callable[[], Replica | None],
        active: Callable[[], str],
    ) -> None:
        """`held`: the replica the standby holds now (None: none yet); `active`: the validator active
        for the round it holds (the chain rule, from the counted result that led to it)."""
        self.setup, self.peer, self.me, self.held, self.active = setup, peer, me, held, active
        self.cfg = setup.manifest.gauntlet()

    async def on_replica(self, origin: str, envelope: bytes) -> str | None:
        """Fetch and keep the blobs of the pushed result; None once held, else why it is refused."""
        try:
            verified = open_signed(envelope, run_id=self.setup.run_id, expect=RoundResult)
        except ProtocolError as exc:
            return f"not a signed round result of this run: {exc}"
        result, signer = verified.message, verified.sender_hex
        replica = self.held()
        if replica is None:
            return "this standby holds no state yet"
        refusal = self._check(result, signer, replica)
        if refusal is not None:
            return refusal
        return await self._fetch_all(origin, result, self.cfg.max_payload_bytes or default_max_bytes(replica.weights))

    def _check(self, result: RoundResult, signer: str, replica: Replica) -> str | None:
        if signer not in self.setup.manifest.validators:
            return f"signed by {signer[:12]}, not one of the run's validators"
        active = self.active()
        if signer != active:
            return f"signed by {signer[:12]}, but the validator active for round {result.round} is {active[:12]}"
        if result.round != replica.round or result.base_state_hash != replica.state_hash:
            return (
                f"a result of round {result.round} from state {result.base_state_hash[:12]}; this standby holds "
                f"round {replica.round}, state {replica.state_hash[:12]}"
            )
        cap = default_max_bytes(replica.weights)
        if result.patch_size > cap:
            return f"oversize patch: {result.patch_size} bytes, the cap is {cap}"
        if result.evidence.size > MAX_EVIDENCE_BYTES:
            return f"oversize evidence: {result.evidence.size} bytes, the cap is {MAX_EVIDENCE_BYTES}"
        return None

    async def _fetch_all(self, origin: str, result: RoundResult, max_payload: int) -> str | None:
        """The evidence, the payloads it lists and the patch, from `origin` only; all or nothing."""
        r, peer, fetched = result.round, self.peer, []

        async def fetch(sha256: str, size: int) -> Path:
            had = peer.store.has(sha256)
            path = await peer.fetch_from(origin, sha256, size, r)
            if not had:
                fetched.append(sha256)
            return path

        try:
            evidence_path = await fetch(result.evidence.sha256, result.evidence.size)
            evidence = RoundEvidence.from_bytes(await _read(evidence_path))
            refusal = self._check_evidence(evidence, max_payload)
            if refusal is not None:
                raise ProtocolError(refusal)
            for entry in evidence.aggregated:
                await fetch(entry.payload_sha256, entry.payload_size)
            await fetch(result.patch_sha256, result.patch_size)
        except (TransferError, ProtocolError, NetworkError, OSError) as exc:
            for sha in fetched:  # a refused replica leaves nothing behind
                peer.store.remove(sha)
            return f"its blobs could not be had as the result names them: {exc}"
        peer.hold(result.patch_sha256, r)
        for sha in (result.evidence.sha256, *(e.payload_sha256 for e in evidence.aggregated)):
            peer.hold(sha, r, "payload")
        count = len(evidence.aggregated)
        log.info("round %d: holding the active validator's patch, evidence and %d payloads", r, count)
        return None

    def _check_evidence(self, evidence: RoundEvidence, max_payload: int) -> str | None:
        if len(evidence.aggregated) > self.cfg.max_submissions:
            return f"the evidence lists {len(evidence.aggregated)} payloads, more than {self.cfg.max_submissions}"
        for entry in evidence.aggregated:
            if entry.payload_size > max_payload:
                size, sha = entry.payload_size, entry.payload_sha256[:12]
                return f"oversize payload {sha}: {size} bytes, the cap is {max_payload}"
        return None


async def _read(path: Path) -> bytes:
    return await asyncio.get_running_loop().run_in_executor(None, path.read_bytes)
