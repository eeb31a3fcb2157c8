"""Where an auditor's FP32 replica starts (`auditor.py`), first that applies:

1. its own committed state on disk (`folder/validator`, the validator's own layout: a standby's
   state and an auditor's are one thing). If the result that led to it does not count (another
   validator's result for that round does, the chain rule of `node/net/peer.py`), it steps back one
   round (`StateStore.rewind`); if it cannot, it starts over from 2 or 3. If the run is so far
   ahead that the payloads of its round may be gone (`keep_payload_rounds`), 3 comes first;
2. W_0 from the manifest, while no round has closed, or while round 0's result starts from it and
   its payloads are still kept;
3. the newest FP32 checkpoint a signed result names (`RoundResult.master_checkpoint`).

    start = ReplicaStart(setup, peer, events, store, initial, blobs)
    found = await start.find()         # (replica, the result that led to it), or None: nothing yet
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from typing import TypeVar

from safetensors import SafetensorError
from safetensors.torch import load as load_tensors

from node.events import Events
from node.events.audit import AuditStarted
from node.net.peer import Peer
from node.roles.auditblobs import RoundBlobs
from node.run.setup import RunSetup
from protocol.errors import ProtocolError, TransferError
from protocol.messages import RoundResult
from protocol.signing import Verified, open_signed
from protocol.state import StateDict
from protocol.statehash import state_hash
from validator.audit import Replica
from validator.core import initial_snapshot
from validator.evidence import RoundEvidence
from validator.state import StateStore

log = logging.getLogger(__name__)
T = TypeVar("T")
Found = tuple[Replica, Verified[RoundResult] | None]  # the replica and the result that led to its state


async def still_counts(peer: Peer, mine: Verified[RoundResult]) -> bool:
    """Whether no other validator's result of that round counts instead (ours may be unpublished yet)."""
    result = mine.message
    counted = await peer.counted_result(result.round, result.base_state_hash)
    return counted is None or counted.statement_id == mine.statement_id


class ReplicaStart:
    def __init__(
        self,
        setup: RunSetup,
        peer: Peer,
        events: Events,
        store: StateStore,
        initial: Callable[[], StateDict],
        blobs: RoundBlobs,
    ) -> None:
        """`store`: the replica's committed state (`folder/validator`); `initial`: W_0 in FP32."""
        self.setup, self.peer, self.events = setup, peer, events
        self.store, self.initial, self.blobs = store, initial, blobs
        self.cfg = setup.manifest.gauntlet()
        self.run_id = setup.run_id
        self.keep = setup.manifest.round.payload_rounds

    async def find(self) -> Found | None:
        """The replica to audit from (see the module docstring), or None if none is available yet."""
        return await self._from_disk() or await self._from_initial() or await self._from_checkpoint()

    async def _from_disk(self) -> Found | None:
        while self.store.exists():
            snap = await _cpu(self.store.load)
            last = open_signed(snap.result, run_id=self.run_id, expect=RoundResult) if snap.result else None
            if last is None or await still_counts(self.peer, last):
                if await self._too_old(snap.book.round):
                    newer = await self._from_checkpoint()
                    if newer is not None:
                        return newer
                replica = await _cpu(Replica.from_snapshot, snap, self.cfg)
                self._started("disk", replica)
                return replica, last
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

    def _discard(self, why: str) -> None:
        folder = self.store.directory
        aside = folder.with_name(f"{folder.name}.stale-{int(time.time())}")
        log.warning("setting the state in %s aside (%s): it is kept in %s", folder, why, aside)
        shutil.move(folder, aside)

    async def _from_initial(self) -> Found | None:
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
        return replica, None

    async def _from_checkpoint(self) -> Found | None:
        head = await self.peer.latest_result_round()
        for r in range(head, max(-1, head - self.setup.manifest.round.checkpoint_every - 2), -1):
            for verified in await self.peer.from_validators(RoundResult, r):
                replica = await self._load_checkpoint(verified)
                if replica is not None:
                    return replica, verified
        return None

    async def _load_checkpoint(self, verified: Verified[RoundResult]) -> Replica | None:
        result = verified.message
        if result.master_checkpoint is None:
            return None
        try:
            data = await self.blobs.fetch(result.master_checkpoint, result.round)
            evidence_bytes = await self.blobs.fetch(result.evidence, result.round)
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
        self._started("checkpoint", replica)
        return replica

    def _started(self, source: str, replica: Replica) -> None:
        self.events.emit(
            AuditStarted(round=replica.round, source=source, state_hash=replica.state_hash),  # type: ignore[arg-type]
            f"auditing from round {replica.round} ({source}), state {replica.state_hash[:12]}",
        )


async def _cpu(fn: Callable[..., T], *args: object) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
