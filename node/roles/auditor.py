"""The auditor: an FP32 replica that follows the run's counted chain and recomputes every round.

    auditor = Auditor(setup, peer, events, folder)
    held = await auditor.sync()        # audits every published round it can, returns what it holds
    await auditor.run(rounds)          # `pulse audit`: sync until holding W_rounds (None: forever)

Where the replica starts (`start`), first that applies:

1. its own committed state on disk (`folder/validator`, the validator's own layout: a standby's
   state and an auditor's are one thing). If the result that led to it does not count (another
   validator's result for that round does, the chain rule of `node/net/peer.py`), it steps back one
   round (`StateStore.rewind`); if it cannot, it starts over from 2 or 3. If the run is so far
   ahead that the payloads of its round may be gone (`keep_payload_rounds`), 3 comes first;
2. W_0 from the manifest, while no round has closed, or while round 0's result starts from it and
   its payloads are still kept;
3. the newest FP32 checkpoint a signed result names (`RoundResult.master_checkpoint`).

For each round it fetches the result's evidence, the aggregated payloads and the patch (from the
validators or any holder), recomputes the step (`validator/audit.py`, in an executor), and only if
every check passes commits the next state, appends the result to its ledger and re-serves what it
fetched for `keep_payload_rounds` rounds. A round whose result fails is reported once (`AuditMismatch`,
with what differs) and the replica stays on the last verified state: `pulse follow --audit` serves
only verified weights. Inputs nobody serves yet are not a verdict: the round is tried again later,
until (`run`) no later round has been published for `give_up_seconds` either: the run ended and its
validator left with them. `run` announces each round it holds (a heartbeat, as a follower), so a
validator ending the run lingers until an auditor that kept up holds the final state.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from safetensors import SafetensorError
from safetensors.torch import load as load_tensors

from node.events import Events, mb
from node.events.audit import Audited, AuditMismatch, AuditStarted
from node.net.peer import Peer
from node.roles.catchup import Held
from node.run.setup import RunSetup
from protocol.errors import ProtocolError, TransferError
from protocol.messages import BlobRef, RoundResult
from protocol.signing import Verified, open_signed
from protocol.state import StateDict
from protocol.statehash import state_hash
from validator.audit import AuditContext, AuditReport, Replica, audit_round
from validator.core import initial_snapshot
from validator.evidence import RoundEvidence
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
        self.setup, self.peer, self.events, self.poll, self.initial = setup, peer, events, poll, initial
        self.stop_on_mismatch = stop_on_mismatch
        self.cfg = manifest.gauntlet()
        self.ctx = AuditContext(setup.run_id, tuple(manifest.validators), self.cfg)
        self.folder = folder / "validator"
        self.store = StateStore(self.folder, max(self.cfg.keep_rounds, 2))
        self.keep = manifest.round.payload_rounds
        self.replica: Replica | None = None
        self.last: Verified[RoundResult] | None = None  # the result that led to the replica's state
        self.refused: set[str] = set()  # statement ids of results that failed their audit
        self.mismatches: list[AuditMismatch] = []
        self.kept: dict[int, list[str]] = {}  # round -> payload and evidence blobs re-served
        deadline = manifest.round.deadline_seconds
        self.give_up_seconds = 2 * deadline if give_up_seconds is None else give_up_seconds
        self.unfetched: tuple[int, float] | None = None  # (round, since when) its inputs are not fetchable

    # -- where the replica starts ------------------------------------------------------------------

    async def start(self) -> Replica:
        """The replica to audit from (see the module docstring); waits until one is available."""
        while self.replica is None:
            self.replica = await self._from_disk() or await self._from_initial() or await self._from_checkpoint()
            if self.replica is None:
                await asyncio.sleep(self.poll)
        return self.replica

    def release(self) -> None:
        """Drop the replica from memory (the validator now steps this folder's state itself)."""
        self.replica, self.last = None, None

    async def _from_disk(self) -> Replica | None:
        while self.store.exists():
            snap = await _cpu(self.store.load)
            last = open_signed(snap.result, run_id=self.ctx.run_id, expect=RoundResult) if snap.result else None
            if last is None or await self._still_counts(last):
                if await self._too_old(snap.book.round):
                    newer = await self._from_checkpoint()
                    if newer is not None:
                        return newer
                replica = await _cpu(Replica.from_snapshot, snap, self.cfg)
                self.last = last
                self._started("disk", replica)
                return replica
            if not await _cpu(self.store.rewind):
                self._discard(f"its result of round {last.message.round} does not count and it cannot step back")
                return None
            log.info("stepped back to round %d: another validator's result counts", last.message.round)
        return None

    async def _too_old(self, round_: int) -> bool:
        """Whether the run is so far past `round_` that its payloads may no longer be kept (a validator
        back after a long absence): then a newer signed FP32 checkpoint is the better start."""
        head = await self.peer.latest_result_round(start=round_)
        return head - round_ >= self.keep - 1

    async def _still_counts(self, mine: Verified[RoundResult]) -> bool:
        """Whether no other validator's result of that round counts instead (ours may be unpublished yet)."""
        result = mine.message
        counted = await self.peer.counted_result(result.round, result.base_state_hash)
        return counted is None or counted.statement_id == mine.statement_id

    def _discard(self, why: str) -> None:
        aside = self.folder.with_name(f"{self.folder.name}.stale-{int(time.time())}")
        log.warning("setting the state in %s aside (%s): it is kept in %s", self.folder, why, aside)
        shutil.move(self.folder, aside)

    async def _from_initial(self) -> Replica | None:
        head, first = await self.peer.latest_result()
        if head >= self.keep:  # round 0's payloads are gone: replaying from W_0 cannot finish
            return None
        snap = await _cpu(lambda: initial_snapshot(self.cfg, self.initial()))
        replica = await _cpu(Replica.from_snapshot, snap, self.cfg)
        if first is not None:
            zero = await self.peer.round_result(0)
            if zero is None or zero.master_before != replica.fp32_hash:
                return None  # the run's W_0 is not the one derived here (e.g. another machine's warm start)
        await _cpu(self.store.commit, snap)
        self._started("initial", replica)
        return replica

    async def _from_checkpoint(self) -> Replica | None:
        head = await self.peer.latest_result_round()
        for r in range(head, max(-1, head - self.setup.manifest.round.checkpoint_every - 2), -1):
            for verified in await self.peer.from_validators(RoundResult, r):
                replica = await self._load_checkpoint(verified)
                if replica is not None:
                    return replica
        return None

    async def _load_checkpoint(self, verified: Verified[RoundResult]) -> Replica | None:
        result = verified.message
        if result.master_checkpoint is None:
            return None
        try:
            data = await self._fetch(result.master_checkpoint, result.round)
            evidence_bytes = await self._fetch(result.evidence, result.round)
            evidence = RoundEvidence.from_bytes(evidence_bytes)
            state = load_tensors(data)
        except (TransferError, ProtocolError, SafetensorError) as exc:
            log.info("FP32 checkpoint of round %d unusable: %s", result.round, exc)
            return None
        if state_hash(state) != result.master_after:
            log.warning("the FP32 checkpoint of round %d does not hash to its result's state", result.round)
            return None
        replica = await _cpu(Replica.from_fp32, state, self.cfg, evidence.book)
        if replica.state_hash != result.new_state_hash:
            log.warning("the FP32 checkpoint of round %d does not give its BF16 state", result.round)
            return None
        if self.store.exists():  # an older state, too far behind: its ledger cannot continue from here
            self._discard(f"the FP32 checkpoint of round {result.round} replaces it")
        await _cpu(self.store.commit, replica.snapshot(verified.signed.to_bytes(), None, evidence_bytes))
        self.last = verified
        self._started("checkpoint", replica)
        return replica

    def _started(self, source: str, replica: Replica) -> None:
        self.events.emit(
            AuditStarted(round=replica.round, source=source, state_hash=replica.state_hash),  # type: ignore[arg-type]
            f"auditing from round {replica.round} ({source}), state {replica.state_hash[:12]}",
        )

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
            if verified is None and self.last is not None and not await self._still_counts(self.last):
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
            inputs = await self._inputs(result)
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
        self._serve(result, report, evidence, payloads)
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

    async def _inputs(self, result: RoundResult) -> tuple[bytes, dict[str, bytes], bytes | None]:
        """(evidence, aggregated payloads by hash, the patch or None if nobody serves it)."""
        r = result.round
        evidence = await self._fetch(result.evidence, r)
        payloads: dict[str, bytes] = {}
        try:
            listed = RoundEvidence.from_bytes(evidence).aggregated
        except ProtocolError:
            listed = ()  # the audit reports the evidence itself
        for entry in listed:
            blob = BlobRef(sha256=entry.payload_sha256, size=entry.payload_size)
            payloads[entry.payload_sha256] = await self._fetch(blob, r)
        try:
            patch: bytes | None = await self._fetch(BlobRef(sha256=result.patch_sha256, size=result.patch_size), r)
        except TransferError as exc:
            log.info("round %d: the patch is not fetchable (%s); re-encoding it", r, exc)
            patch = None
        return evidence, payloads, patch

    async def _fetch(self, blob: BlobRef, round_: int) -> bytes:
        path = await self.peer.fetch(blob.sha256, blob.size, round_)
        return await _cpu(path.read_bytes)

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

    def _serve(self, result: RoundResult, report: AuditReport, evidence: bytes, payloads: dict[str, bytes]) -> None:
        """Re-serve the round's patch, evidence and payloads; payloads and evidence of old rounds go."""
        if report.patch is not None:
            self.peer.hold(self.peer.store.put(report.patch), result.round)
        kept = [self.peer.store.put(evidence), *(self.peer.store.put(p) for p in payloads.values())]
        for sha in kept:
            self.peer.hold(sha, result.round, "payload")
        self.kept[result.round] = kept
        for old in [r for r in self.kept if r <= result.round - self.keep]:
            for sha in self.kept.pop(old):
                self.peer.store.remove(sha)


async def _cpu(fn: Callable[..., T], *args: object) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
