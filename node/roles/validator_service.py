"""The validator on the network: opens rounds, takes pushed submissions, closes at the deadline, publishes.

Round r, as the validator runs it:

1. open: publish a heartbeat for r (its `sent_at` starts the deadline clock), and every
   `checkpoint_every` rounds (and at start-up) a full BF16 checkpoint as a blob, its piece index
   (so joiners fetch pieces from many holders at once) and its announcement; then the run's head
   (`RunHead`: round r, W_r's hash, the latest checkpoint, this peer);
2. collect: miners push signed headers and payloads over `rpc_submit`; one per miner, this round only.
   Each header is seated or refused before its body is read (`validator.admission`): established
   miners first, newcomers drawn at random for the seats left, every payload's announced size
   reserved against the round's byte budget; a refusal is answered with its reason, a newcomer
   unseated after its body arrived is reported (`Dropped`). Payloads stay on disk, in `inbox/`
   (apart from the blobs this node serves), until the round decodes them, and are removed when it
   closes or when they are refused: disk and memory do not grow with the number of senders;
3. close at the deadline, or earlier (after `min_seconds`) once every miner that announced itself
   for r (heartbeat) or submitted in r-1 has submitted, or (adaptive deadlines) once a quorum of
   them has and the target learned from recent arrival times has passed (`deadline.py`; the open
   heartbeat names that target, so miners can size their payloads to it): nobody is waited for
   beyond the deadline;
4. score, select, aggregate and step (`validator.core.Validator.run_round`, in a thread), store the
   PULSESync patch, the round's evidence and (every `checkpoint_every` rounds) the FP32 state as
   blobs and publish the signed round result; report the held-out measure, and publish it with the
   round's byte counts and the miners' standings (`RoundMetrics`, for run pages). The aggregated
   payloads stay fetchable for `keep_payload_rounds` rounds, so anyone can recompute the round.

With several validators in the manifest (`standby.py` runs this service when this validator is
the active one), it checks before publishing and at every opening that no other validator's result
counts for its round (the chain rule, `node/net/peer.py`); if one does, it raises `Superseded` and
continues as a standby. Before publishing a round's result it hands it to the standbys that announced
the round and waits (at most `replicate_seconds`) until one holds the patch, evidence and payloads it
names (`replicas.py`), so that losing this validator right after it published costs at most a round.
Before opening a round it gives the standbys a moment to audit the last one
(`_await_standbys`), so the evidence it alone held has another holder should it die now. A
standby that takes a round over hands it the submissions it collected (`take_over`).

What depends on the task comes from two objects: the `Task` (W_0, the Gauntlet's evaluator and
batch function) and its `RoundHooks` (RL: the rollout pool before a round opens; the held-out loss
or reward after it closes). The network is the `Peer` the service is given.

Records live `record_ttl_seconds`, but a run and even one round may last longer: while it runs, the
service re-publishes the head and the round results since the latest checkpoint on a timer (every
`head_refresh_seconds`), so a node joining at any round finds where the run is and the whole patch
chain it needs, in a number of reads that does not grow with the round.

With `rounds`, it stops after round `rounds - 1` (holding W_rounds) once every node seen in the last
round holds that state (its heartbeat says so), or after `linger_seconds`: the last patch stays
fetchable for them until then.

State lives in `folder/validator` (committed once per round) and patches in `folder/blobs`, so a
restarted validator resumes at its last committed round and continues the hash chain. The inbox is
emptied at start-up: the payloads of a round cut off by a restart are void (the round starts over).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from node.events import Events, mb
from node.events.models import (
    Baseline,
    CheckpointAnnounced,
    Done,
    Dropped,
    Received,
    RoundClosed,
    RoundOpened,
    Started,
)
from node.learn.train import changed_fraction
from node.net.blobstore import BlobStore
from node.net.peer import Peer
from node.roles.catchup import CHECKPOINT_FORMAT
from node.roles.chainstate import checkpoint_bytes
from node.roles.deadline import RoundClock
from node.roles.hooks import HeldOut, RoundHooks
from node.roles.keyclash import KeyClashWatch
from node.roles.replicas import replicate
from node.run.setup import RunSetup
from node.run.task import Task
from protocol.codec import default_max_bytes
from protocol.errors import ConfigError, NetworkError, Superseded
from protocol.identity import Identity
from protocol.messages import (
    HEAD_ROUND,
    CheckpointAnnouncement,
    Heartbeat,
    RoundMetrics,
    RoundResult,
    RunHead,
    Standing,
    SubmissionHeader,
)
from protocol.pieces import checkpoint_index
from protocol.signing import SignedMessage, Verified
from protocol.state import State
from validator.admission import Admission, AdmissionRules
from validator.core import RoundReport, Validator
from validator.intake import Payload, Submission, payload_sha256, payload_size
from validator.scoring import RoundSecret
from validator.state import StateStore

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5
HEAD_REFRESH_SECONDS = 60.0  # at most; a quarter of the record lifetime when that is shorter
MIN_LINGER_SECONDS = 30.0


def head_refresh_seconds(record_ttl_seconds: float) -> float:
    """How often the head and the results since the checkpoint are re-published: well within a record's life."""
    return min(HEAD_REFRESH_SECONDS, record_ttl_seconds / 4)


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
        *,
        poll: float = POLL_SECONDS,
        device: str = "cpu",
    ) -> None:
        if identity.public_hex not in setup.manifest.validators:
            raise ConfigError("this key is not one of the manifest's validators; add its public key to `validators`")
        self.setup, self.task, self.hooks, self.identity = setup, task, hooks, identity
        self.folder, self.peer, self.events, self.poll = folder, peer, events, poll
        self.validator = self._open_state(device)
        self.received: dict[str, Submission] = {}  # by sender, this round; payloads are files in the inbox
        self.arrivals: dict[str, float] = {}  # by sender, this round: seconds after the open
        self.clock = RoundClock(setup.manifest.round)
        self.key_watch = KeyClashWatch(identity.public_hex, peer.peer_id)  # a second process with this key
        self.previous_senders: set[str] = set()
        self.active = 0  # miners active in the open round, as `_collect` last counted them
        self.closed = True
        self.opened_at = 0.0
        self.checkpoint: CheckpointAnnouncement | None = None  # the latest one announced
        self.since_checkpoint: list[RoundResult] = []  # the results of the rounds since it, in order
        timing = setup.manifest.round
        self.refresh_seconds = head_refresh_seconds(timing.record_ttl_seconds)
        self.linger_seconds = max(timing.deadline_seconds, MIN_LINGER_SECONDS)
        self.dense_bytes = setup.dense_bytes()
        self.kept: dict[int, list[str]] = {}  # round -> aggregated payloads and evidence, kept fetchable
        cfg = setup.manifest.gauntlet()
        # refuse an oversize payload from its header, before its body is read or stored
        self.max_payload = cfg.max_payload_bytes or default_max_bytes(self.validator.weights)
        self.rules = AdmissionRules(
            capacity=cfg.max_submissions,
            newcomer_seats=min(cfg.newcomer_seats, cfg.max_submissions),
            byte_budget=cfg.round_payload_bytes or 8 * self.max_payload,
        )
        self.admission = Admission(self.rules, frozenset(), b"")
        self.inbox = BlobStore(folder / "inbox")
        self._empty_inbox()  # a round cut off by a restart starts over: its payloads are void
        self.inbox.clear_partials()
        peer.take_submissions(self._accept, self._on_submission, self.inbox, self._favoured)

    def _open_state(self, device: str) -> Validator:
        s, task = self.setup, self.task
        folder = self.folder / "validator"
        cfg, run_id = s.manifest.gauntlet(), s.run_id
        evaluator = task.evaluator(device)  # the Gauntlet's forward passes run on `device`
        if StateStore(folder, cfg.keep_rounds).exists():
            return Validator.open(folder, cfg, run_id, self.identity, evaluator, task.batch_fn())
        master = task.initial_master()
        return Validator.create(folder, cfg, run_id, self.identity, master, evaluator, task.batch_fn())

    @property
    def round(self) -> int:
        return self.validator.round

    # -- intake (runs on the event loop, called by the transfer service) --------------------------

    def _accept(self, header: SubmissionHeader) -> str | None:
        """A verified header, before its body: None seats it, else the reason it is refused."""
        if self.closed or header.round != self.round:
            if header.round == self.round:
                return f"round {header.round} has closed: the validator is scoring it"
            return f"round {header.round} is not open (the open round is {self.round})"
        if header.payload_size > self.max_payload:
            return f"oversize: {header.payload_size} bytes announced, the cap is {self.max_payload}"
        verdict = self.admission.offer(header.sender, header.payload_size)
        for sender, reason in verdict.unseated:
            self._drop(sender, reason)
        return verdict.refusal

    def _favoured(self, header: SubmissionHeader) -> bool:
        """Established miners (admission's first seats) may also use the reserved upload slots."""
        return header.sender in self.admission.established

    def _on_submission(self, verified: Verified[SubmissionHeader], path: Path) -> str | None:
        """Its body arrived (verified, at `path` in the inbox): None keeps it for the round."""
        header = verified.message
        if self.closed or header.round != self.round:
            refusal: str | None = f"round {header.round} closed while its body arrived"
        else:
            refusal = self.admission.arrive(header.sender)
        if refusal is not None:
            self._discard(header.payload_sha256)
            return refusal
        self.received[header.sender] = Submission(verified.signed.to_bytes(), path)
        self.arrivals[header.sender] = time.time() - self.opened_at
        self.events.emit(
            Received(round=header.round, sender=header.sender, bytes=header.payload_size),
            f"round {header.round}: received {mb(header.payload_size)} from miner {header.sender[:12]}",
        )
        return None

    def _drop(self, sender: str, reason: str) -> None:
        """`sender` lost its seat: a received payload leaves the round (one in flight is refused on arrival)."""
        sub = self.received.pop(sender, None)
        self.arrivals.pop(sender, None)  # a dropped submission's arrival teaches the deadline nothing
        if sub is None:
            log.info("round %d: %s... %s (its body had not arrived)", self.round, sender[:12], reason)
            return
        assert isinstance(sub.payload, Path)
        self._discard(sub.payload.name)
        text = f"round {self.round}: dropped {sender[:12]}'s submission: {reason}"
        self.events.emit(Dropped(round=self.round, sender=sender, reason=reason), text)

    def _discard(self, sha256: str) -> None:
        """Remove a payload from the inbox unless a submission still in the round has the same bytes."""
        if all(not isinstance(s.payload, Path) or s.payload.name != sha256 for s in self.received.values()):
            self.inbox.remove(sha256)

    def _empty_inbox(self) -> None:
        for sha in list(self.inbox):
            self.inbox.remove(sha)

    # -- rounds ----------------------------------------------------------------------------------

    async def run(self, rounds: int | None = None) -> None:
        """Run rounds until `rounds` have completed in total (None: forever), then linger (see above)."""
        key, peer_id = self.identity.public_hex, self.peer.peer_id
        self.events.emit(
            Started(sender=key, round=self.round, peer_id=peer_id),
            f"validator {key[:12]} at round {self.round}, peer id {peer_id}",
        )
        await self._republish()
        if self.validator.last_result is None:
            measured = await self._cpu(self.hooks.baseline)
            if measured.measured:
                text = f"held-out {measured.describe()} of the initial weights"
                self.events.emit(Baseline(loss=measured.loss, reward=measured.reward), text)
        refresher = asyncio.ensure_future(self._keep_fresh())
        try:
            first = True
            while rounds is None or self.round < rounds:
                await self._check_counted()
                await self._await_standbys(self.round)
                await self._open(checkpoint=first or self.round % self.setup.manifest.round.checkpoint_every == 0)
                first = False
                await self._collect()
                await self._close()
            await self._publish_head()
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

    async def _keep_fresh(self) -> None:
        """Every `refresh_seconds`: the head, and the results since the latest checkpoint (re-signed, so
        each gets a new lifetime), so that what a joiner needs outlives any record's lifetime."""
        while True:
            await asyncio.sleep(self.refresh_seconds)
            await self._publish_head()
            for result in list(self.since_checkpoint):
                try:
                    await self.peer.publish(result)
                except NetworkError as exc:
                    log.warning("could not refresh the result of round %d: %s", result.round, exc)

    async def _publish_head(self) -> None:
        if self.checkpoint is None:
            return
        head = RunHead(
            run_id=self.setup.run_id,
            round=HEAD_ROUND,
            open_round=self.round,
            state_hash=self.validator.state_hash,
            checkpoint=self.checkpoint,
            validator_peer=self.peer.peer_id,
            sent_at=int(time.time()),
        )
        try:
            await self.peer.publish(head)
        except NetworkError as exc:  # joiners search the round results meanwhile; the timer tries again
            log.warning("could not publish the run's head at round %d: %s", self.round, exc)

    async def _cpu(self, measure: Callable[[State], HeldOut]) -> HeldOut:
        return await asyncio.get_running_loop().run_in_executor(None, measure, self.validator.weights)

    async def _republish(self) -> None:
        """After a restart: the last result again (DHT records may have expired or never landed), and
        the blobs it names that this validator can make again."""
        v = self.validator
        if v.last_result is None or v.last_patch is None:
            return
        last = self.round - 1
        self.peer.hold(self.peer.store.put(v.last_patch), last)
        if v.last_evidence is not None:
            self.peer.hold(self.peer.store.put(v.last_evidence), last, "payload")
        result = SignedMessage.from_bytes(v.last_result)
        named = RoundResult.from_canonical(result.body).master_checkpoint
        if named is not None and not self.peer.store.has(named.sha256):
            data = await asyncio.get_running_loop().run_in_executor(None, v.fp32_checkpoint)
            if self.peer.store.put(data) == named.sha256:  # the committed master is the state after that round
                self.peer.hold(named.sha256, self.round, "checkpoint")  # the state W_round: kept with its BF16
        await self.peer.publish_signed(v.last_result)

    async def take_over(self, received: dict[str, Submission]) -> None:
        """Close the open round with the submissions a standby collected (its validator published no
        result in time); the caller then `run`s the service from the next round."""
        self.received = {sender: self._into_inbox(sub) for sender, sub in received.items()}
        self.closed = False
        self.opened_at = time.time()
        await self._close()

    def _into_inbox(self, sub: Submission) -> Submission:
        """A standby's collected submission with its payload moved into this service's inbox, which
        `_close` empties (both folders are this validator's, on one disk)."""
        if not isinstance(sub.payload, Path):
            return sub
        target = self.inbox.path(sub.payload.name)
        if not target.exists():  # two senders may have pushed the same bytes: one file for both
            sub.payload.replace(target)
        return Submission(sub.envelope, target)

    async def _check_counted(self) -> None:
        """Before opening round r: the result that counts for round r-1 is this validator's, or nobody's
        yet (`Superseded` otherwise: a higher-priority validator's late result, or a standby's takeover)."""
        v = self.validator
        if v.round == 0 or v.last_result is None or len(v.book.states) < 2:
            return
        mine = SignedMessage.from_bytes(v.last_result)
        counted = await self.peer.counted_result(v.round - 1, v.book.states[-2])
        if counted is not None and counted.statement_id != mine.statement_id:
            raise Superseded(v.round - 1, counted.sender_hex)

    async def _await_standbys(self, r: int) -> None:
        """Before opening round r: give the standbys that stood by in round r-1 up to `takeover_seconds`
        to audit it (their heartbeat for round r). Until one has fetched them, round r-1's evidence is
        held here alone, and a standby that cannot audit round r-1 cannot take round r over."""
        if r == 0 or len(self.setup.manifest.validators) < 2:
            return
        me = self.identity.public_hex
        waiting = {v.sender_hex for v in await self.peer.validator_heartbeats(r - 1)} - {me}
        end = time.monotonic() + self.setup.manifest.round.takeover_seconds
        while waiting and time.monotonic() < end:
            waiting -= {v.sender_hex for v in await self.peer.validator_heartbeats(r)}
            if waiting:
                await asyncio.sleep(self.poll)

    async def _check_unclaimed(self, round_: int, base: str) -> None:
        """Before publishing round r: no other validator published one already (a standby took the round
        over while this one was slow): publishing too would make nodes that applied it switch back."""
        for other in await self.peer.from_validators(RoundResult, round_):
            if other.sender_hex != self.identity.public_hex and other.message.base_state_hash == base:
                raise Superseded(round_, other.sender_hex)

    async def _open(self, *, checkpoint: bool) -> None:
        r = self.round
        await self.key_watch.check(self.peer, r, self.validator.state_hash)  # before it writes anything
        if checkpoint:
            await self._announce_checkpoint(r)
        await self.hooks.before_open(r, self.validator.state_hash, self._recent_states(), self.validator.weights)
        self.received, self.arrivals, self.active = {}, {}, len(self.previous_senders)
        self._empty_inbox()  # nothing of an earlier round stays (a body may have landed after its close)
        secret = RoundSecret.derive(self.identity, self.setup.run_id, r).key("admission")
        self.admission = Admission(self.rules, self.validator.established(), secret)
        self.closed = False
        self.opened_at = time.time()
        target = self.clock.target()
        # the heartbeat's clock starts at its signed sent_at, whole seconds: the target it names counts
        # from there (else miners would budget up to a second less than the round gives them)
        sent_at = int(self.opened_at)
        await self.peer.heartbeat(
            r, self.validator.state_hash, target_seconds=target + (self.opened_at - sent_at), sent_at=sent_at
        )
        await self._publish_head()
        self.events.emit(
            RoundOpened(round=r, state_hash=self.validator.state_hash, target_seconds=target),
            f"round {r} open, state {self.validator.state_hash[:12]}, submissions expected within {target:.1f}s",
        )

    async def _announce_checkpoint(self, r: int) -> None:
        data = checkpoint_bytes(self.validator.weights)
        sha = self.peer.store.put(data)
        self.peer.hold(sha, r, "checkpoint")
        index = await asyncio.get_running_loop().run_in_executor(None, checkpoint_index, data)
        index.check_root(self.validator.state_hash)  # a bug here would make every joiner refuse every piece
        index_bytes = index.to_bytes()
        index_sha = self.peer.store.put(index_bytes)
        self.peer.hold(index_sha, r, "checkpoint")
        announcement = CheckpointAnnouncement(
            run_id=self.setup.run_id,
            round=r,
            state_hash=self.validator.state_hash,
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

    async def _collect(self) -> None:
        """Until `self.clock` closes the round: its deadline, everyone in, or (adaptive) quorum + target."""
        timing = self.setup.manifest.round
        while (elapsed := time.time() - self.opened_at) < timing.deadline_seconds:
            await asyncio.sleep(self.poll)
            if elapsed < timing.min_seconds or not self.received:
                continue
            announced = {v.sender_hex for v in await self.peer.get(Heartbeat, self.round) if v.message.role == "miner"}
            active = announced | self.previous_senders | set(self.received)
            self.active = len(active)
            if self.clock.should_close(time.time() - self.opened_at, received=len(self.received), active=len(active)):
                return
        log.info("round %d: deadline reached with %d submissions", self.round, len(self.received))

    async def _close(self) -> None:
        self.closed = True
        open_seconds = time.time() - self.opened_at
        self.clock.record(self.arrivals.values(), active=self.active)  # the quorum's arrivals teach the clock
        r, senders, submissions = self.round, list(self.received), list(self.received.values())
        sent = sum(payload_size(s.payload) for s in submissions)
        loop = asyncio.get_running_loop()
        before, base = self.validator.weights, self.validator.state_hash
        report = await loop.run_in_executor(None, lambda: self.validator.run_round(submissions))
        changed = changed_fraction(before, self.validator.weights)
        self.received = {}
        self._store_blobs(report, submissions)
        self._empty_inbox()  # every payload of the round is decided: the aggregated ones were kept above
        # a standby holds the round's blobs before anyone can see the result: should this validator die
        # right after publishing, the standby can still verify and serve the new state, and go on
        await replicate(self.peer, self.setup, self.identity.public_hex, r, report.envelope, self.events)
        await self._check_unclaimed(r, base)
        try:
            await self.peer.publish_signed(report.envelope)
        except NetworkError as exc:
            log.warning("round %d result not stored in the DHT yet (%s); retrying once", r, exc)
            await asyncio.sleep(1.0)
            await self.peer.publish_signed(report.envelope)
        self.since_checkpoint.append(report.result)
        self.previous_senders = set(senders)
        start = time.monotonic()
        measured = await self._cpu(lambda weights: self.hooks.after_close(r, weights))
        held_out_seconds = time.monotonic() - start
        self._report(
            report,
            len(submissions),
            sent,
            measured,
            changed,
            held_out_seconds=held_out_seconds,
            open_seconds=open_seconds,
        )
        try:
            await self.peer.publish(self._metrics(report, len(submissions), sent, measured))
        except NetworkError as exc:  # run pages miss one round's figures; nothing else depends on them
            log.warning("round %d metrics not stored in the DHT: %s", r, exc)

    def _store_blobs(self, report: RoundReport, submissions: list[Submission]) -> None:
        """The patch, evidence and FP32 checkpoint as served blobs; the aggregated payloads copied from
        the inbox and kept for `keep_payload_rounds` rounds (with the evidence), so anyone can recompute
        the round."""
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

    def _metrics(self, report: RoundReport, count: int, sent: int, measured: HeldOut) -> RoundMetrics:
        """The round's figures for run pages, each within its field's bounds (a diverged loss is left out)."""
        named = [s.sender for s in report.result.selected] + [r.sender for r in report.result.rejections]
        ratings, indicators = self.validator.ratings, self.validator.book.indicators
        loss, reward = measured.loss, measured.reward
        return RoundMetrics(
            run_id=self.setup.run_id,
            round=report.round,
            held_out_loss=loss if loss is not None and 0 <= loss <= 1e6 else None,
            held_out_reward=reward if reward is not None and math.isfinite(reward) else None,
            submissions=count,
            received_bytes=sent,
            dense_bytes=self.dense_bytes * count,
            standings=tuple(
                Standing(
                    sender=key,
                    rating=min(max(ratings.ordinal(key), -1e6), 1e6),
                    indicator=min(max(indicators.get(key, 0.0), -1.0), 1.0),
                )
                for key in dict.fromkeys(named)
            ),
        )

    def _recent_states(self) -> dict[int, str]:
        """Round -> state hash for the rounds the validator's book still names (newest is this round's)."""
        states = self.validator.book.states
        return {self.round - len(states) + 1 + i: h for i, h in enumerate(states)}

    def _report(
        self,
        report: RoundReport,
        count: int,
        sent: int,
        measured: HeldOut,
        changed: float,
        *,
        held_out_seconds: float | None = None,
        open_seconds: float | None = None,
    ) -> None:
        selected = report.selected()
        ranked = sorted(report.result.selected, key=lambda s: -s.score)
        seats = self.admission
        event = RoundClosed(
            round=report.round,
            submissions=count,
            selected=len(selected),
            bytes=sent,
            dense_bytes=self.dense_bytes * count,
            patch_bytes=len(report.patch),
            state_bytes=self.dense_bytes // 2,  # the BF16 weights, what a dense sync would ship
            loss=measured.loss,
            reward=measured.reward,
            changed_fraction=changed,
            scores={s.sender: s.score for s in ranked},
            rejections={r.sender: r.reason for r in report.result.rejections},
            state_hash=report.state_hash,
            seconds=report.seconds,
            ignored=[o.reason for o in report.outcomes if o.status == "ignored"],
            decide_seconds=report.decide_seconds,
            encode_seconds=report.encode_seconds,
            held_out_seconds=held_out_seconds if measured.measured else None,
            open_seconds=open_seconds,
            arrivals=dict(self.arrivals),
            offered=seats.offered,
            refused=seats.refused,
            unseated=seats.unseated,
            established=len(seats.established),
        )
        held_out = f", held-out {measured.describe()}" if measured.measured else ""
        turned = f" ({seats.refused} refused, {seats.unseated} unseated)" if seats.refused or seats.unseated else ""
        smaller = f" ({self.dense_bytes * count / sent:.0f}x smaller than dense)" if sent else ""
        received = f"{mb(sent)} received{smaller}" if sent else "nothing received"
        self.events.emit(
            event,
            f"round {report.round} closed: {count} submissions{turned}, {len(selected)} aggregated, "
            f"{received}, patch {mb(len(report.patch))}, new state {report.state_hash[:12]}{held_out}",
        )

    async def shutdown(self) -> None:
        await self.peer.shutdown()


def _copy_in(store: BlobStore, sha256: str, payload: Payload) -> None:
    """Store `payload` (bytes, or a file read in blocks) as blob `sha256` of `store`."""
    if not isinstance(payload, Path):
        store.put(payload)
        return
    with payload.open("rb") as src, store.writer(sha256, payload.stat().st_size) as blob:
        while chunk := src.read(1 << 20):
            blob.write(chunk)
        blob.commit()
