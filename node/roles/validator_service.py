"""The validator on the network: the loop of rounds, phase by phase. It does none of the jobs itself:

    intake = RoundIntake(setup, events, folder / "inbox")       # `intake.py`: what miners push
    peer = network.join(identity, folder, role="validator", intake=intake)
    service = ValidatorService(setup, task, hooks, identity, folder, peer, events, intake)
    await service.run(rounds)

- the `Validator` (`validator.core`) holds the state and decides each round (score, select,
  aggregate, step, sign), in a thread;
- the `RoundIntake` (`intake.py`, given at construction, the same object the transfer service
  calls) seats headers and keeps bodies for the open round;
- the `ChainPublisher` (`publisher.py`) announces checkpoints, the head and results, keeps them
  fresh, serves and retires the round's blobs;
- the `RoundClock` (`deadline.py`) says when a round may close; `summary.py` its figures;
- with several validators, `chainrule.py` checks around each round that no other validator's
  result counts instead of this one's.

Round r, phase by phase (`Phase`):

1. OPENING: (with several validators) check the result that counts for r-1 is this validator's
   (`Superseded` otherwise: it continues as a standby, `standby.py`) and give the standbys a moment
   to audit it; every `checkpoint_every` rounds (and at start-up) announce a checkpoint; the task's
   hooks prepare the round; open the intake on W_r; publish a heartbeat for r (its `sent_at` starts
   the deadline clock, and it names the target the clock learned, so miners can size their
   payloads) and the run's head;
2. COLLECTING: until the deadline, or earlier (after `min_seconds`) once every miner that announced
   itself for r (established keys, and newcomers only as many as seats: `Admission.awaited`, and
   no longer than the others took again: `deadline.py`) or was aggregated in r-1
   (`senders_to_wait_for`) has submitted, or
   (adaptive deadlines) once a quorum of them has and the learned target has passed: nobody is
   waited for beyond the deadline;
3. CLOSING: close the intake; run the round; store its blobs; hand the result to the standbys
   that announced the round and wait (at most `replicate_seconds`) until one holds what it names
   (`replicas.py`); check no other validator published for r; publish; measure the held-out loss or
   reward (the task's hooks) and publish the round's figures (`RoundMetrics`).

After round `rounds - 1` (LINGERING) it serves the last patch until every node seen in the last
round holds W_rounds (its heartbeat says so), or `linger_seconds`. A standby that takes a round over
hands its intake, with what it collected, to a new service (`take_over`), which closes that round.

Time: wall-clock readings (round opening, arrivals, the deadline, signed `sent_at`) come from
`clock`, a parameter (a test passes a skewed one); durations use the monotonic clock.

State lives in `folder/validator` (committed once per round) and patches in `folder/blobs`, so a
restarted validator resumes at its last committed round and continues the hash chain; the intake's
inbox is emptied at start-up: the payloads of a round cut off by a restart are void.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path

from node.events import Events
from node.events.models import Baseline, Done, RoundOpened, Started
from node.learn.train import changed_fraction
from node.net.peer import Peer
from node.roles.chainrule import await_standbys, check_counted, check_unclaimed
from node.roles.deadline import RoundClock
from node.roles.hooks import HeldOut, RoundHooks
from node.roles.intake import Clock, RoundIntake, terms_of
from node.roles.keyclash import KeyClashWatch
from node.roles.publisher import ChainPublisher
from node.roles.replicas import replicate
from node.roles.summary import Figures, round_closed, round_metrics
from node.run.setup import RunSetup
from node.run.task import Task
from protocol.errors import ConfigError, NetworkError
from protocol.identity import Identity
from protocol.messages import Heartbeat
from protocol.state import State
from validator.core import Validator
from validator.gauntlet import Outcome
from validator.intake import payload_size
from validator.state import StateStore

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5
MIN_LINGER_SECONDS = 30.0


def senders_to_wait_for(outcomes: Iterable[Outcome]) -> set[str]:
    """The senders of a closed round that the next round knows and waits for: those it aggregated.

    Anything less can cost nothing to make, and a key the next round knows holds it open, in the
    fixed deadline mode until its deadline: a fresh key that sends once and never again would do
    that to every round. Bytes that do not decode, updates refused before evaluation (a norm far
    from the median, a copy of the public previous step: `Gauntlet.inspect`), and a random direction
    at the median norm all qualify; the last is evaluated, and its own-data indicator comes out +1
    in about half the rounds, so one round's indicator is no evidence of work (a record of them is:
    aggregation needs one). An honest miner that was not aggregated is not lost: it announces itself,
    so the next round still waits for it as an established key (if it is one), or as a newcomer,
    for as long again as the miners it knows took (`deadline.py`)."""
    return {o.sender for o in outcomes if o.sender is not None and o.status == "selected"}


class Phase(Enum):
    """Where the service is in its loop (see the module docstring)."""

    STARTING = "starting"
    OPENING = "opening"
    COLLECTING = "collecting"
    CLOSING = "closing"
    LINGERING = "lingering"


class ValidatorService:
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
        device: str = "cpu",
        clock: Clock | None = None,
        validator_class: type[Validator] = Validator,
    ) -> None:
        """`intake`: the one the peer's transfer service was built with; `clock`: wall-clock seconds
        (the intake's unless given); `validator_class`: what holds the state and decides each round
        (a test double may lie: the audit's tests and fault runs)."""
        if identity.public_hex not in setup.manifest.validators:
            raise ConfigError("this key is not one of the manifest's validators; add its public key to `validators`")
        self.setup, self.task, self.hooks, self.identity = setup, task, hooks, identity
        self.folder, self.peer, self.events, self.poll = folder, peer, events, poll
        self.intake, self.clock = intake, clock or intake.clock
        self.validator = self._open_state(device, validator_class)
        self.publisher = ChainPublisher(setup, peer, events, clock=self.clock)
        self.deadline = RoundClock(setup.manifest.round)
        self.phase = Phase.STARTING
        self.closing = (self.round, self.validator.state_hash)  # where the head stays while a round closes
        # another process signing with this key stops this one before it writes anything
        self.key_watch = KeyClashWatch(identity.public_hex, peer.peer_id, int(self.clock()))
        self.previous_senders: set[str] = set()  # the last round's, that the next one waits for
        self.active = 0  # miners active in the open round, as `_collect` last counted them
        self.linger_seconds = max(setup.manifest.round.deadline_seconds, MIN_LINGER_SECONDS)
        self.dense_bytes = setup.dense_bytes()

    def _open_state(self, device: str, validator_class: type[Validator]) -> Validator:
        s, task = self.setup, self.task
        folder = self.folder / "validator"
        cfg, run_id = s.manifest.gauntlet(), s.run_id
        evaluator = task.evaluator(device)  # the Gauntlet's forward passes run on `device`
        if StateStore(folder, cfg.keep_rounds).exists():
            return validator_class.open(folder, cfg, run_id, self.identity, evaluator, task.batch_fn())
        master = task.initial_master()
        return validator_class.create(folder, cfg, run_id, self.identity, master, evaluator, task.batch_fn())

    @property
    def round(self) -> int:
        return self.validator.round

    @property
    def closed(self) -> bool:
        """Whether no round is collecting now (the intake refuses every header)."""
        return self.phase is not Phase.COLLECTING

    # -- the loop --------------------------------------------------------------------------------------

    async def run(self, rounds: int | None = None) -> None:
        """Run rounds until `rounds` have completed in total (None: forever), then linger (see above)."""
        key, peer_id = self.identity.public_hex, self.peer.peer_id
        self.events.emit(
            Started(sender=key, round=self.round, peer_id=peer_id),
            f"validator {key[:12]} at round {self.round}, peer id {peer_id}",
        )
        await self.publisher.republish(self.validator)
        if self.validator.last_result is None:
            measured = await self._cpu(self.hooks.baseline)
            if measured.measured:
                text = f"held-out {measured.describe()} of the initial weights"
                self.events.emit(Baseline(loss=measured.loss, reward=measured.reward), text)
        refresher = asyncio.ensure_future(self.publisher.keep_fresh(self._where))
        try:
            first = True
            while rounds is None or self.round < rounds:
                await self._open(checkpoint=first or self.round % self.setup.manifest.round.checkpoint_every == 0)
                first = False
                await self._collect()
                await self._close()
            self.phase = Phase.LINGERING
            await self.publisher.publish_head(*self._where())
            self.events.emit(
                Done(round=self.round, state_hash=self.validator.state_hash),
                f"completed round {self.round - 1}; serving the last patch until the nodes of the run hold "
                f"state {self.validator.state_hash[:12]} (at most {self.linger_seconds:.0f} s)",
            )
            await self._linger()
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher

    async def take_over(self) -> None:
        """Close the round the intake holds (a standby collected it; its validator published no result
        in time); the caller then `run`s the service from the next round."""
        if self.intake.round != self.round:  # its submissions name another round: screened out as stale
            log.warning("taking over round %d with an intake of round %d", self.round, self.intake.round)
        self.phase = Phase.COLLECTING
        await self._close()

    def _where(self) -> tuple[int, str]:
        if self.phase is Phase.CLOSING:  # the state steps in a thread: its round moves before its hash
            return self.closing
        return self.round, self.validator.state_hash

    async def _open(self, *, checkpoint: bool) -> None:
        self.phase = Phase.OPENING
        r, v = self.round, self.validator
        await self.key_watch.check(self.peer, r, v.state_hash)  # before it writes anything
        await check_counted(self.peer, v)  # the chain rule with several validators: `chainrule.py`
        await await_standbys(self.peer, self.setup, self.identity.public_hex, r, self.poll)
        if checkpoint:
            await self.publisher.announce_checkpoint(r, v.weights, v.state_hash)
        await self.hooks.before_open(r, v.state_hash, self._recent_states(), v.weights)
        self.active = len(self.previous_senders)
        self.intake.open(terms_of(self.setup, self.identity, v.book, v.state_hash, v.weights), opened_at=self.clock())
        self.peer.grant_standing(list(self.intake.admission.established))  # their send slots are kept here
        self.phase = Phase.COLLECTING
        opened_at, target = self.intake.opened_at, self.deadline.target()
        # the heartbeat's clock starts at its signed sent_at, whole seconds: the target it names counts
        # from there (else miners would budget up to a second less than the round gives them)
        sent_at = int(opened_at)
        await self.peer.heartbeat(r, v.state_hash, target_seconds=target + (opened_at - sent_at), sent_at=sent_at)
        await self.publisher.publish_head(r, v.state_hash)
        self.events.emit(
            RoundOpened(round=r, state_hash=v.state_hash, target_seconds=target),
            f"round {r} open, state {v.state_hash[:12]}, submissions expected within {target:.1f}s",
        )

    async def _collect(self) -> None:
        """Until `self.deadline` closes the round: its deadline, everyone in, or (adaptive) quorum + target."""
        timing, intake = self.setup.manifest.round, self.intake
        known_in: float | None = None  # when every miner the round knew was in
        while (elapsed := self.clock() - intake.opened_at) < timing.deadline_seconds:
            await asyncio.sleep(self.poll)
            if elapsed < timing.min_seconds or not intake.received:
                continue
            known, newcomers = await self.awaited()
            since, received = self.clock() - intake.opened_at, set(intake.received)
            if known_in is None and known and known <= received:
                known_in = since
            active = known | received
            self.active = len(active)
            if self.deadline.should_close(
                since, received=len(received), active=self.active, newcomers=len(newcomers - active), known_in=known_in
            ):
                return
        log.info("round %d: deadline reached with %d submissions", self.round, len(intake.received))

    async def awaited(self) -> tuple[set[str], set[str]]:
        """The miners the open round waits for: (the ones it knows: senders of the last round and the
        established keys that announced themselves; the newcomers that did, as many as seats, by
        ticket: `Admission.awaited`). Announcements cost nothing, so newcomers move neither the
        quorum nor the target, and are waited for only so long (`deadline.py`)."""
        announced = {v.sender_hex for v in await self.peer.get(Heartbeat, self.round) if v.message.role == "miner"}
        admission = self.intake.admission
        waited = admission.awaited(announced)
        known = self.previous_senders | {k for k in waited if k in admission.established}
        return known, waited - known

    async def _close(self) -> None:
        self.closing = self._where()  # what the head says until the next round opens (the refresher reads it)
        self.phase = Phase.CLOSING
        intake = self.intake
        intake.close()
        open_seconds = self.clock() - intake.opened_at
        self.deadline.record(intake.arrivals.values(), active=self.active)  # the quorum's arrivals teach it
        r, submissions = self.round, list(intake.received.values())
        sent = sum(payload_size(s.payload) for s in submissions)
        loop = asyncio.get_running_loop()
        before, base = self.validator.weights, self.validator.state_hash
        try:
            report = await loop.run_in_executor(None, lambda: self.validator.run_round(submissions))
        except asyncio.CancelledError:  # Ctrl+C: the round's thread stops before its next payload (it
            self.validator.stopping.set()  # would run on for minutes at a real size, and exit waits for it)
            raise
        changed = changed_fraction(before, self.validator.weights)
        self.publisher.store_round(report, submissions)
        intake.empty()  # every payload of the round is decided: the aggregated ones were kept above
        # a standby holds the round's blobs before anyone can see the result: should this validator die
        # right after publishing, the standby can still verify and serve the new state, and go on
        await replicate(self.peer, self.setup, self.identity.public_hex, r, report.envelope, self.events)
        await check_unclaimed(self.peer, self.identity.public_hex, r, base)
        await self.publisher.publish_result(report)
        self.previous_senders = senders_to_wait_for(report.outcomes)
        start = time.monotonic()
        measured = await self._cpu(lambda weights: self.hooks.after_close(r, weights))
        figures = Figures(
            len(submissions), sent, self.dense_bytes, measured, changed, time.monotonic() - start, open_seconds
        )
        self.events.emit(*round_closed(report, figures, intake))
        try:
            await self.peer.publish(round_metrics(self.setup, self.validator, report, figures))
        except NetworkError as exc:  # run pages miss one round's figures; nothing else depends on them
            log.warning("round %d metrics not stored in the DHT: %s", r, exc)

    async def _linger(self) -> None:
        """Until every miner or follower seen in the last round announces the final state, or `linger_seconds`."""
        final, last = self.validator.state_hash, self.round - 1
        deadline = time.monotonic() + self.linger_seconds
        while time.monotonic() < deadline:
            seen = {
                v.sender_hex
                for r in (last, self.round)
                for v in await self.peer.get(Heartbeat, r)
                if v.message.role in ("miner", "follower")
            }
            done = {v.sender_hex for v in await self.peer.get(Heartbeat, self.round) if v.message.state_hash == final}
            if seen <= done:
                return
            await asyncio.sleep(self.poll)
        log.info("stopping: not every node announced the final state within %.0f s", self.linger_seconds)

    def _recent_states(self) -> dict[int, str]:
        """Round -> state hash for the rounds the validator's book still names (newest is this round's)."""
        states = self.validator.book.states
        return {self.round - len(states) + 1 + i: h for i, h in enumerate(states)}

    async def _cpu(self, measure: Callable[[State], HeldOut]) -> HeldOut:
        return await asyncio.get_running_loop().run_in_executor(None, measure, self.validator.weights)

    async def shutdown(self) -> None:
        await self.peer.shutdown()
