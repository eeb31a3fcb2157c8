"""The auditor: an FP32 replica that follows the run's counted chain and recomputes every round.

    auditor = Auditor(setup, peer, events, folder)
    held = await auditor.sync()        # audits every published round it can, returns what it holds
    await auditor.run(rounds)          # `pulse audit`: sync until holding W_rounds (None: forever)

Where the replica starts (`start`): its own state on disk, W_0, or the newest signed FP32
checkpoint (`auditstart.py` says which comes first and when).

For each round it fetches the result's evidence, the aggregated payloads and the patch (from the
validators or any holder, `auditblobs.py`), recomputes the step (`validator/audit.py`, in an
executor), and only if every check passes commits the next state, appends the result to its ledger
and re-serves what it fetched for `keep_payload_rounds` rounds. A round whose result fails is
reported once (`AuditMismatch`, with what differs) and the replica stays on the last verified state:
`pulse follow --audit` serves only verified weights. Inputs nobody serves yet are not a verdict: the
round is tried again later, until (`run`) no later round has been published for `give_up_seconds`
either: the run ended and its validator left with them. `run` announces each round it holds (a
heartbeat, as a follower), so a validator ending the run lingers until an auditor that kept up holds
the final state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from node.events import Events, mb
from node.events.audit import Audited, AuditMismatch
from node.net.peer import Peer
from node.roles.auditblobs import RoundBlobs
from node.roles.auditstart import ReplicaStart, still_counts
from node.roles.catchup import Held
from node.run.setup import RunSetup
from protocol.errors import TransferError
from protocol.messages import RoundResult
from protocol.signing import Verified
from protocol.state import StateDict
from validator.audit import AuditContext, AuditReport, Replica, audit_round
from validator.state import StateStore

log = logging.getLogger(__name__)
POLL_SECONDS = 1.0
T = TypeVar("T")


class Auditor:
    def __init__(
        self,
        setup: RunSetup,
        peer: Peer,
        events: Events,
        folder: Path,
        initial: Callable[[], StateDict],
        *,
        poll: float = POLL_SECONDS,
        stop_on_mismatch: bool = False,
        give_up_seconds: float | None = None,
    ) -> None:
        """`initial`: W_0 in FP32 (the task's `initial_master`), called only if the replica starts there;
        `stop_on_mismatch`: `run` returns at the first result that does not recompute; `give_up_seconds`:
        how long `run` waits for a round's inputs once no later round is published (default: two deadlines)."""
        manifest = setup.manifest
        self.setup, self.peer, self.events, self.poll = setup, peer, events, poll
        self.stop_on_mismatch = stop_on_mismatch
        self.cfg = manifest.gauntlet()
        self.ctx = AuditContext(setup.run_id, tuple(manifest.validators), self.cfg)
        self.store = StateStore(folder / "validator", max(self.cfg.keep_rounds, 2))
        self.blobs = RoundBlobs(peer, keep=manifest.round.payload_rounds)
        self.origin = ReplicaStart(setup, peer, events, self.store, initial, self.blobs)
        self.replica: Replica | None = None
        self.last: Verified[RoundResult] | None = None  # the result that led to the replica's state
        self.refused: set[str] = set()  # statement ids of results that failed their audit
        self.mismatches: list[AuditMismatch] = []
        deadline = manifest.round.deadline_seconds
        self.give_up_seconds = 2 * deadline if give_up_seconds is None else give_up_seconds
        self.unfetched: tuple[int, float] | None = None  # (round, since when) its inputs are not fetchable

    # -- where the replica starts ------------------------------------------------------------------

    async def start(self) -> Replica:
        """The replica to audit from (`auditstart.py`); waits until one is available."""
        while self.replica is None:
            found = await self.origin.find()
            if found is None:
                await asyncio.sleep(self.poll)
                continue
            self.replica, self.last = found
        return self.replica

    def release(self) -> None:
        """Drop the replica from memory (the validator now steps this folder's state itself)."""
        self.replica, self.last = None, None

    # -- following the chain -------------------------------------------------------------------------

    def held(self) -> Held:
        if self.replica is None:
            raise RuntimeError("the auditor holds no replica yet: call start() first")
        return Held(self.replica.round, self.replica.weights, self.replica.state_hash)

    async def sync(self, until: int | None = None) -> Held:
        """Audit every counted result from the replica's round on (up to W_until); return what it holds."""
        replica = await self.start()
        while until is None or replica.round < until:
            verified = await self.peer.counted_result(replica.round, replica.state_hash)
            if verified is None and self.last is not None and not await still_counts(self.peer, self.last):
                # the result it applied lost to a validator earlier in the manifest's order (the chain
                # rule): step back and take the one that counts
                self.release()
                replica = await self.start()
                continue
            if verified is None or verified.statement_id in self.refused or not await self._audit(verified):
                break
            replica = await self.start()
        return self.held()

    async def run(self, rounds: int | None = None) -> Held:
        """`pulse audit`: follow and recompute until holding W_rounds (None: forever), or until the first
        mismatch with `stop_on_mismatch`."""
        held, announced = await self.sync(rounds), None
        while (rounds is None or held.round < rounds) and not (self.stop_on_mismatch and self.mismatches):
            if announced != held.round:  # lists what it re-serves; a validator that ends lingers until the last
                await self.peer.heartbeat(held.round, held.state_hash)
                announced = held.round
            if await self._run_ended(held.round):
                break
            await asyncio.sleep(self.poll)
            held = await self.sync(rounds)
        await self.peer.heartbeat(held.round, held.state_hash)
        return held

    async def _run_ended(self, round_: int) -> bool:
        """Whether round `round_`'s inputs went unserved for `give_up_seconds` with no later round
        published: the run ended and its validator left with them (an audit would retry forever)."""
        if self.unfetched is None or self.unfetched[0] != round_:
            return False
        waited = time.monotonic() - self.unfetched[1]
        if waited < self.give_up_seconds or await self.peer.round_result(round_ + 1) is not None:
            return False
        log.warning(
            "round %d: no holder served its inputs for %.0f s and no later round was published: the run has "
            "ended; stopping at the audited state of round %d",
            round_,
            waited,
            round_,
        )
        return True

    async def _audit(self, verified: Verified[RoundResult]) -> bool:
        """Fetch a round's inputs and recompute it; commit and re-serve on success. False: stay here."""
        result, replica = verified.message, await self.start()
        start = time.monotonic()
        try:
            inputs = await self.blobs.inputs(result)
        except TransferError as exc:
            log.info("round %d: inputs not fetchable yet (%s); trying again later", result.round, exc)
            if self.unfetched is None or self.unfetched[0] != result.round:
                self.unfetched = (result.round, time.monotonic())
            return False
        evidence, payloads, patch = inputs
        computing = time.monotonic()
        report = await _cpu(
            audit_round, replica, self.ctx, verified, evidence, lambda a: payloads.get(a.payload_sha256), patch
        )
        compute_seconds = time.monotonic() - computing
        if not report.ok:
            await self._refuse(verified, report)
            return False
        await _cpu(self.store.commit, replica.snapshot(verified.signed.to_bytes(), report.patch, evidence))
        self.last = verified
        fetched = len(evidence) + sum(len(p) for p in payloads.values()) + (len(patch) if patch else 0)
        self.blobs.serve(result, report.patch, evidence, payloads)
        self.events.emit(
            Audited(
                round=result.round,
                signer=verified.sender_hex,
                state_hash=result.new_state_hash,
                aggregated=len(result.selected),
                fetched_bytes=fetched,
                patch_checked=report.patch is not None,
                seconds=time.monotonic() - start,
                compute_seconds=compute_seconds,
            ),
            f"round {result.round} audited: {len(result.selected)} payloads recomputed ({mb(fetched)} fetched), "
            f"state {result.new_state_hash[:12]} verified"
            + ("" if report.patch is not None else " (patch not checked: nobody serves it, re-encoding differs)"),
        )
        return True

    async def _refuse(self, verified: Verified[RoundResult], report: AuditReport) -> None:
        """Report a result that failed (once), and go back to the last verified state."""
        self.refused.add(verified.statement_id)
        findings = [str(f) for f in report.findings]
        event = AuditMismatch(round=report.round, signer=verified.sender_hex, findings=findings)
        self.mismatches.append(event)
        self.events.emit(
            event,
            f"round {report.round}: the result signed by {verified.sender_hex[:12]} does not recompute: "
            + "; ".join(findings)
            + f" (staying on the verified state of round {report.round})",
        )
        self.replica = None  # stepped in place by the audit: reload the committed state
        snap = await _cpu(self.store.load)
        self.replica = await _cpu(Replica.from_snapshot, snap, self.cfg)


async def _cpu(fn: Callable[..., T], *args: object) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
