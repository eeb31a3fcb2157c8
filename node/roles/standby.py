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

from node.events import Events
from node.events.audit import Standby, StoodDown, TookOver
from node.events.models import Done, Started
from node.net.peer import Peer
from node.roles.auditor import Auditor
from node.roles.catchup import Held
from node.roles.hooks import RoundHooks
from node.roles.intake import RoundIntake, terms_of
from node.roles.replicas import ReplicaTaker
from node.roles.validator_service import ValidatorService
from node.run.setup import RunSetup
from node.run.task import Task
from protocol.errors import ConfigError, Superseded
from protocol.identity import Identity
from protocol.messages import Heartbeat, RoundResult

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5
SERVE_HEARTBEAT_SECONDS = 10.0  # a standby done with its rounds announces itself this often while it serves
T = TypeVar("T")


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
        intake: RoundIntake,
        *,
        poll: float = POLL_SECONDS,
        can_take_over: bool = True,
        device: str = "cpu",
    ) -> None:
        """`intake`: this process's, the one the peer's transfer service was built with: the standby
        opens it on each round it reaches, the active service on each round it opens;
        `can_take_over`: whether a standby may close a round another validator opened (the task's say)."""
        manifest = setup.manifest
        if identity.public_hex not in manifest.validators:
            raise ConfigError("this key is not one of the manifest's validators; add its public key to `validators`")
        self.setup, self.task, self.hooks, self.identity = setup, task, hooks, identity
        self.folder, self.peer, self.events, self.poll = folder, peer, events, poll
        self.can_take_over, self.device = can_take_over, device
        self.order, self.me = tuple(manifest.validators), identity.public_hex
        self.auditor = Auditor(setup, peer, events, folder, task.initial_master, poll=2 * poll)
        self.intake = intake
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
            s,
            self.task,
            self.hooks,
            me,
            self.folder,
            self.peer,
            self.events,
            self.intake,
            poll=self.poll,
            device=self.device,
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
        self.intake.close()
        self.intake.empty()  # payloads of a round cut off by a restart or a stand-down are void
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
        replica = self.auditor.replica
        assert replica is not None and replica.round == r  # `held` is what the replica holds
        self.intake.open(terms_of(self.setup, self.identity, replica.book, held.state_hash, held.weights))
        self.peer.grant_standing(list(self.intake.admission.established))  # their send slots are kept here
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
        collected = len(self.intake.received)
        self.intake.close()  # the new service scores what it holds, and opens it on the next round
        self.auditor.release()
        self.peer.take_replicas(None)
        self.service = await _cpu(self._new_service)
        waited = time.time() - self.reached.get(r, time.time())
        self.events.emit(
            TookOver(round=r, previous=previous, submissions=collected, waited=waited),
            f"round {r}: validator {previous[:12]} published no result in time; closing the round "
            f"with the {collected} submissions collected here",
        )
        try:
            await self.service.take_over()
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
