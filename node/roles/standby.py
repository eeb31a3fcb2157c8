"""A validator of a run whose manifest lists several: active or standby, and the handover between them.

    role = ValidatorRole(setup, task, hooks, identity, folder, peer, events)
    await role.run(rounds)                       # `pulse validator`

At start the validator's state is resumed by its auditor (`auditor.py`): its own committed state,
stepped back a round if its last result did not count; W_0 if the run has not closed a round; else
the newest FP32 checkpoint a result names. It is the active validator if it holds the state of the
chain's head and signed the last result (for round 0: if it comes first in the manifest); else it
is a standby.

Active: it runs `ValidatorService` on its state. If another validator's result counts for a round it
closed (`Superseded`), it goes back to its last counted state and continues as a standby.

Standby: it follows the run as an auditor (a verified FP32 replica, and the ratings and the rest of
the book as published), announces itself for the open round r (a validator heartbeat: miners push
to every validator that announces the round, `miner.py`) and keeps what miners push. Before the
active validator publishes a round's result, it hands it to the standbys, which fetch and serve the
patch, evidence and payloads it names (`replicas.py`): should it die right after publishing, the
standby verifies the new state from those and takes the next round over. The active
validator of round r is the one that signed the counted result of round r-1. When no result for r
has appeared by

    opened + deadline_seconds + k x takeover_seconds

(opened: the active validator's heartbeat for r, else when this standby reached r; k: this
validator's place after the active one in the manifest's order, cyclically, so that standbys step
in one after the other; and never sooner than `takeover_seconds` after this standby announced the
round, so that miners can push to one that just started), it closes round r itself with what it
collected, continuing the same hash chain, and is the active validator from then on. A validator
that comes back finds the chain moved on and catches up as a standby.

Nothing is aggregated twice and nothing is lost: a round's submissions are scored in the one result
that counts for it (a submission names its round, so it cannot count in another), and a standby
holds the submissions of the open round should it have to close it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from node.events import Events, mb
from node.events.audit import Standby, StoodDown, TookOver
from node.events.models import Done, Received, Started
from node.net.blobstore import BlobStore
from node.net.peer import Peer
from node.roles.auditor import Auditor
from node.roles.catchup import Held
from node.roles.hooks import RoundHooks
from node.roles.replicas import ReplicaTaker
from node.roles.validator_service import ValidatorService
from node.run.setup import RunSetup
from node.run.task import Task
from protocol.codec import default_max_bytes
from protocol.errors import ConfigError, Superseded
from protocol.identity import Identity
from protocol.messages import Heartbeat, RoundResult, SubmissionHeader
from protocol.signing import Verified
from protocol.state import State
from validator.intake import Submission

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5
SERVE_HEARTBEAT_SECONDS = 10.0  # a standby done with its rounds announces itself this often while it serves
T = TypeVar("T")


class StandbyIntake:
    """What miners push to a standby for the round it holds: one submission per miner, this round only,
    announced sizes capped, at most `max_submissions` miners (the active validator's own rules)."""

    def __init__(
        self, peer: Peer, events: Events, inbox: BlobStore, max_submissions: int, max_payload: int | None = None
    ) -> None:
        """`inbox`: where pushed payloads stay on disk (this intake owns it); `max_payload`: None for the
        codec's own cap, set from the weights at the first `open`."""
        self.peer, self.events, self.inbox = peer, events, inbox
        self.max_submissions, self.cap = max_submissions, max_payload
        self.max_payload = max_payload or 0
        self.round = -1
        self.received: dict[str, Submission] = {}

    def open(self, round_: int, weights: State) -> None:
        """Take submissions for `round_` (from `weights`, W_round); the previous round's payloads go
        (the auditor keeps its own copies of the aggregated ones)."""
        self.max_payload = self.cap or default_max_bytes(weights)
        self.round, self.received = round_, {}
        self.empty()

    def empty(self) -> None:
        for sha in list(self.inbox):
            self.inbox.remove(sha)

    def take(self) -> dict[str, Submission]:
        """The round's submissions, handed to the validator that closes it; the intake closes."""
        taken, self.received, self.round = self.received, {}, -1
        return taken

    def accept(self, header: SubmissionHeader) -> str | None:
        if header.round != self.round:
            return f"round {header.round} is not open at this standby (it holds round {self.round})"
        if header.sender in self.received:
            return "one submission per miner per round"
        if len(self.received) >= self.max_submissions:
            return f"round is full ({self.max_submissions} submissions)"
        if header.payload_size > self.max_payload:
            return f"oversize: {header.payload_size} bytes announced, the cap is {self.max_payload}"
        return None

    def on_submission(self, verified: Verified[SubmissionHeader], path: Path) -> str | None:
        """Its body arrived (at `path` in the inbox): None keeps it for the round."""
        header = verified.message
        refusal = self.accept(header)  # the round may have moved on while the body arrived
        if refusal is not None:
            if all(not isinstance(s.payload, Path) or s.payload != path for s in self.received.values()):
                self.inbox.remove(header.payload_sha256)
            return refusal
        self.received[header.sender] = Submission(verified.signed.to_bytes(), path)
        self.events.emit(
            Received(round=header.round, sender=header.sender, bytes=header.payload_size),
            f"round {header.round}: received {mb(header.payload_size)} from miner {header.sender[:12]} (standby)",
        )
        return None


class ValidatorRole:
    def __init__(
        self,
        setup: RunSetup,
        task: Task,
        hooks: RoundHooks,
        identity: Identity,
        folder: Path,
        peer: Peer,
        events: Events,
        *,
        poll: float = POLL_SECONDS,
        can_take_over: bool = True,
        device: str = "cpu",
    ) -> None:
        """`can_take_over`: whether a standby may close a round another validator opened (the task's say)."""
        manifest = setup.manifest
        if identity.public_hex not in manifest.validators:
            raise ConfigError("this key is not one of the manifest's validators; add its public key to `validators`")
        self.setup, self.task, self.hooks, self.identity = setup, task, hooks, identity
        self.folder, self.peer, self.events, self.poll = folder, peer, events, poll
        self.can_take_over, self.device = can_take_over, device
        self.order, self.me = tuple(manifest.validators), identity.public_hex
        self.auditor = Auditor(setup, peer, events, folder, task.initial_master, poll=2 * poll)
        cfg = manifest.gauntlet()
        inbox = BlobStore(folder / "standby-inbox")
        inbox.clear_partials()
        self.intake = StandbyIntake(peer, events, inbox, cfg.max_submissions, cfg.max_payload_bytes)
        self.service: ValidatorService | None = None
        self.reached: dict[int, float] = {}  # round -> when this standby first held its state
        self.replicas = ReplicaTaker(setup, peer, self.me, lambda: self.auditor.replica, self._active)

    @property
    def round(self) -> int:
        if self.service is not None:
            return self.service.round
        return self.auditor.replica.round if self.auditor.replica is not None else 0

    async def run(self, rounds: int | None = None) -> None:
        """Validate (active) or stand by until the run reaches `rounds` (None: forever); then serve blobs."""
        while True:
            if self.service is not None or await self._resume_active():
                assert self.service is not None
                try:
                    await self.service.run(rounds)  # serves blobs once done: returns only by cancellation
                    return
                except Superseded as exc:
                    self._stand_down(exc)
                    continue
            if await self._stand_by(rounds):
                continue  # took a round over: active from now on
            await self._serve_done()
            return

    # -- which one -----------------------------------------------------------------------------------

    async def _resume_active(self) -> bool:
        """Whether this validator is the active one now (then `self.service` runs its state)."""
        replica = await self.auditor.start()
        r = replica.round
        if await self.peer.latest_result_round(start=r) >= r:
            return False  # the chain is ahead of this state: catch up as a standby
        last = self.auditor.last
        active = last.sender_hex if last is not None else self.order[0]
        if active != self.me:
            return False
        self.auditor.release()
        self.peer.take_replicas(None)
        self.service = await _cpu(self._new_service)
        return True

    def _new_service(self) -> ValidatorService:
        """The active service on this validator's committed state (it takes the pushed submissions)."""
        s, me = self.setup, self.identity
        return ValidatorService(
            s, self.task, self.hooks, me, self.folder, self.peer, self.events, poll=self.poll, device=self.device
        )

    def _stand_down(self, exc: Superseded) -> None:
        self.events.emit(
            StoodDown(round=exc.round, by=exc.by),
            f"round {exc.round}: validator {exc.by[:12]}'s result counts; continuing as a standby",
        )
        self.service = None
        self.auditor.release()  # it reloads the committed state and steps back the round that did not count

    # -- standing by ---------------------------------------------------------------------------------

    async def _stand_by(self, rounds: int | None) -> bool:
        """Audit and collect until taking a round over (True) or holding W_rounds (False)."""
        self.intake.empty()  # payloads of a round cut off by a restart or a stand-down are void
        self.peer.take_submissions(self.intake.accept, self.intake.on_submission, self.intake.inbox)
        self.peer.take_replicas(self.replicas.on_replica)  # the active validator's round blobs, before it publishes
        key, peer_id = self.me, self.peer.peer_id
        self.events.emit(
            Started(sender=key, round=self.round, peer_id=peer_id),
            f"validator {key[:12]} standing by, peer id {peer_id}",
        )
        while True:
            held = await self.auditor.sync()
            r = held.round
            if rounds is not None and r >= rounds:
                return False
            if r not in self.reached:
                await self._open_intake(r, held)
            if self.can_take_over and await self._due(r, held.state_hash):
                await self._take_over(r)
                return True
            await asyncio.sleep(self.poll)

    async def _open_intake(self, r: int, held: Held) -> None:
        self.reached[r] = time.time()
        self.reached = {k: v for k, v in self.reached.items() if k >= r - 1}
        self.intake.open(r, held.weights)
        await self.peer.heartbeat(r, held.state_hash)  # miners push to every validator announcing the round
        active = self._active()
        self.events.emit(
            Standby(round=r, active=active),
            f"round {r}: standing by (active validator {active[:12]}), collecting submissions",
        )

    def _active(self) -> str:
        last = self.auditor.last
        return last.sender_hex if last is not None else self.order[0]

    async def _due(self, r: int, state_hash: str) -> bool:
        """Whether round r is this standby's to close: no result for it, and its time has come."""
        for result in await self.peer.from_validators(RoundResult, r):
            if result.message.base_state_hash == state_hash:
                return False  # closed: the auditor takes it (or refused it: a lie is reported, not replaced)
        active = self._active()
        place = (self.order.index(self.me) - self.order.index(active)) % len(self.order) or len(self.order)
        beat = next((b.message for b in await self.peer.get(Heartbeat, r) if b.sender_hex == active), None)
        opened = beat.sent_at if beat is not None and beat.role == "validator" else self.reached[r]
        timing = self.setup.manifest.round
        due = opened + timing.deadline_seconds + place * timing.takeover_seconds
        # a standby that reached the round late (it just started) announced it only now: miners that
        # trained for it get `takeover_seconds` to push to it before it closes the round
        return time.time() >= max(due, self.reached[r] + timing.takeover_seconds)

    async def _take_over(self, r: int) -> None:
        previous = self._active()
        collected = self.intake.take()
        self.auditor.release()
        self.peer.take_replicas(None)
        self.service = await _cpu(self._new_service)
        waited = time.time() - self.reached.get(r, time.time())
        self.events.emit(
            TookOver(round=r, previous=previous, submissions=len(collected), waited=waited),
            f"round {r}: validator {previous[:12]} published no result in time; closing the round "
            f"with the {len(collected)} submissions collected here",
        )
        try:
            await self.service.take_over(collected)
        except Superseded as exc:
            self._stand_down(exc)

    async def _serve_done(self) -> None:
        held = self.auditor.held()
        self.events.emit(
            Done(round=held.round, state_hash=held.state_hash),
            f"audited up to round {held.round - 1}; serving blobs until stopped",
        )
        while True:
            await self.peer.heartbeat(held.round, held.state_hash)
            await asyncio.sleep(SERVE_HEARTBEAT_SECONDS)

    async def shutdown(self) -> None:
        await self.peer.shutdown()


async def _cpu(fn: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn)
