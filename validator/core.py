"""The validator: owns the FP32 master, the ratings and the replay cache, and runs rounds.

    v = Validator.create(folder, cfg, run_id, identity, master, evaluator, batch_fn)   # round 0
    v = Validator.open(folder, cfg, run_id, identity, evaluator, batch_fn)             # resume
    report = v.run_round(submissions)   # one Outcome per submission, signed result, patch

A round: screen (intake.py), decide (`RoundPipeline.decide`, gauntlet.py: outcomes, the selected,
the next ratings and indicator averages), aggregate and step the master, encode the patch, write
the round's evidence (evidence.py) and sign the result, commit (state.py). The result commits to
the FP32 state before and after the step, the outer step's settings and the evidence, so anyone
can recompute the step (audit.py). Everything for round r is computed from the state of round
r; the state of round r+1 is committed and only then adopted in memory. Inputs are the same
after a restart (the validator's randomness is a hash of its own signature), so re-running a
round that was cut off before its commit gives the same result and patch, byte for byte.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save as save_tensors

from protocol import pulsesync
from protocol.errors import ConfigError, CorruptState
from protocol.identity import Identity
from protocol.messages import BlobRef, OuterStep, RoundResult
from protocol.signing import SeenCache, sign
from protocol.state import State, StateDict
from protocol.statehash import state_hash
from validator.admission import Established
from validator.config import GauntletConfig
from validator.evidence import build_evidence
from validator.gauntlet import Decision, Outcome, RoundPipeline, Standing, earning_of, established, seat_standing
from validator.intake import RoundContext, Submission, screen
from validator.outer import OuterOptimizer
from validator.ratings import Ratings
from validator.scoring import BatchFn, Evaluator, RoundSecret
from validator.state import Book, CrashHook, Snapshot, StateStore

SPILL_FOLDER = "decoded"  # a round's decoded updates (validator/spill.py), gone when it ends
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundReport:
    round: int
    outcomes: tuple[Outcome, ...]  # one per submission, in arrival order
    result: RoundResult
    envelope: bytes  # the signed result, as published
    patch: bytes  # PULSESync patch W_r -> W_{r+1}
    state_hash: str  # SHA-256 of W_{r+1}
    median_norm: float
    seconds: float  # run_round from start to commit
    decide_seconds: float = 0.0  # of which: intake, decoding, scoring and selection
    encode_seconds: float = 0.0  # of which: encoding the PULSESync patch
    evidence: bytes = b""  # the round's evidence blob, named by the result
    master_checkpoint: bytes | None = None  # the FP32 state after the step, when the result names it

    def selected(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "selected"]


class Validator:
    def __init__(
        self,
        cfg: GauntletConfig,
        run_id: str,
        identity: Identity,
        evaluator: Evaluator,
        batch_fn: BatchFn,
        store: StateStore,
        snap: Snapshot,
    ) -> None:
        self.cfg, self.run_id, self.identity = cfg, run_id, identity
        self.evaluator, self.batch_fn, self.store = evaluator, batch_fn, store
        self.outer = OuterOptimizer(cfg.outer, snap.master)
        self.outer.load_state_tensors(snap.momentum, snap.book.outer_steps)
        # W_{r-1}: the public step W_{r-1} - W_r is what a key must not get standing for sending back
        self.previous_weights = store.previous_weights(snap.book.round)
        self._adopt(snap.book, snap.result, snap.patch, snap.evidence)
        if self.state_hash != snap.book.states[-1]:
            raise CorruptState("the saved master weights do not give the saved state hash")
        self.fp32_hash = state_hash(self.outer.fp32_state())  # what the next result's `master_before` names
        self._broken = False
        # set by a node that is shutting down: the round in progress raises `RoundStopped` before its
        # next payload instead of deciding (nothing of it is kept, as after a crash); clear to go on
        self.stopping = threading.Event()

    @classmethod
    def create(
        cls,
        directory: Path,
        cfg: GauntletConfig,
        run_id: str,
        identity: Identity,
        master: State,
        evaluator: Evaluator,
        batch_fn: BatchFn,
        *,
        crash_hook: CrashHook | None = None,
    ) -> Validator:
        """A validator at round 0 with `master` (FP32) as W_0; refuses a folder that holds a state."""
        store = StateStore(directory, cfg.keep_rounds, crash_hook)
        if store.exists():
            raise ConfigError(f"{directory} already holds a validator state: open it instead")
        snap = initial_snapshot(cfg, master)
        store.commit(snap)
        return cls(cfg, run_id, identity, evaluator, batch_fn, store, snap)

    @classmethod
    def open(
        cls,
        directory: Path,
        cfg: GauntletConfig,
        run_id: str,
        identity: Identity,
        evaluator: Evaluator,
        batch_fn: BatchFn,
        *,
        crash_hook: CrashHook | None = None,
    ) -> Validator:
        """Resume from the last committed round."""
        store = StateStore(directory, cfg.keep_rounds, crash_hook)
        return cls(cfg, run_id, identity, evaluator, batch_fn, store, store.load())

    @property
    def round(self) -> int:
        return self.book.round

    def _adopt(
        self,
        book: Book,
        result: bytes | None,
        patch: bytes | None,
        evidence: bytes | None,
        weights: tuple[StateDict, str] | None = None,
    ) -> None:
        """Take `book` and the master's BF16 weights as the current round's; `weights`: those weights
        and their hash when the caller has just made them from this master (a round's step), so
        that a 0.5B round does not convert and hash them a second time."""
        self.book = book
        self.ratings = Ratings(self.cfg.openskill_beta, self.cfg.openskill_tau, self.cfg.missing_rounds, book.ratings)
        self.seen = SeenCache(self.cfg.seen_capacity, book.seen)
        if weights is None:
            bf16 = self.outer.bf16_weights()
            weights = bf16, state_hash(bf16)
        self.weights, self.state_hash = weights
        self.last_result, self.last_patch, self.last_evidence = result, patch, evidence

    def context(self, pipeline: RoundPipeline) -> RoundContext:
        return round_context(self.cfg, self.run_id, self.book, self.state_hash, pipeline.cap)

    def run_round(self, submissions: Sequence[Submission]) -> RoundReport:
        """Screen, decide, aggregate and step, encode and sign, commit; then move to the next round."""
        if self._broken:
            raise RuntimeError("a previous round failed midway: reopen the validator from disk")
        start = time.perf_counter()
        spill = self.store.directory / SPILL_FOLDER
        if spill.exists():
            shutil.rmtree(spill)  # what a crashed round left behind (a finished round removes it)
        with self._pipeline(spill) as pipeline:
            screened = screen(submissions, self.context(pipeline), self.seen)
            secret = RoundSecret.derive(self.identity, self.run_id, self.round)
            decision = pipeline.decide(screened, secret, self.standing(), run_id=self.run_id, round_=self.round)
            decided = time.perf_counter()

            self._broken = True  # from here the master changes before the commit
            before = Step(self.fp32_hash, self.outer.steps)
            aggregated = pipeline.aggregate(decision.selected)
        new_weights, new_hash = self._step(aggregated.update if aggregated is not None else None)
        master_after = state_hash(self.outer.fp32_state())
        stepped = time.perf_counter()
        patch = self._encode(new_weights, new_hash)
        encoded = time.perf_counter()
        book = self._next_book(decision.standing, screened.message_ids, new_hash)
        evidence = build_evidence(self.run_id, self.round, secret, decision, aggregated, submissions, book).to_bytes()
        checkpoint = self.fp32_checkpoint() if (self.round + 1) % self.cfg.fp32_checkpoint_every == 0 else None
        result = self._result(decision, patch, new_hash, before, master_after, evidence, checkpoint)
        envelope = sign(self.identity, result).to_bytes()
        self._commit(book, envelope, patch, evidence, (new_weights, new_hash))
        self.fp32_hash = master_after
        self._broken = False

        seconds = time.perf_counter() - start
        report = RoundReport(
            result.round, decision.outcomes, result, envelope, patch, new_hash, decision.median_norm, seconds,
            decide_seconds=decided - start, encode_seconds=encoded - stepped, evidence=evidence,
            master_checkpoint=checkpoint,
        )  # fmt: skip
        _log_report(report)
        return report

    def _pipeline(self, spill: Path | None = None) -> RoundPipeline:
        """The round's pipeline; `spill`: the folder for its decoded updates (None: no spill)."""
        return RoundPipeline(
            self.cfg, self.weights, self.evaluator, self.batch_fn, spill, self.previous_weights, self.stopping
        )

    def _encode(self, new_weights: State, new_hash: str) -> bytes:
        """The PULSESync patch W_r -> W_{r+1}."""
        return pulsesync.encode(self.weights, new_weights, old_hash=self.state_hash, new_hash=new_hash)

    def standing(self) -> Standing:
        """The miners' ratings, indicator averages and rounds gained this round starts from."""
        gained = {m: tuple(r) for m, r in self.book.gained.items()}
        return Standing(self.ratings, self.book.indicators, gained, dict(self.book.since), frozenset(self.book.waited))

    def established(self) -> Established:
        """Miners with a history of earned standing (`gauntlet.established`), each with its standing
        (`seat_standing`): seated first and by standing (admission.py), the norm reference."""
        return established_in(self.cfg, self.book)

    def _step(self, update: StateDict | None) -> tuple[StateDict, str]:
        """Apply the outer step (none without an update); the new BF16 weights and their hash."""
        if update is not None:
            self.outer.step(update)
            del update
        new_weights = self.outer.bf16_weights()
        return new_weights, state_hash(new_weights)

    def fp32_checkpoint(self) -> bytes:
        """The FP32 state the next step reads, as a safetensors file (what `master_checkpoint` names)."""
        return fp32_checkpoint_bytes(self.outer.fp32_state())

    def _result(
        self,
        decision: Decision,
        patch: bytes,
        new_hash: str,
        before: Step,
        master_after: str,
        evidence: bytes,
        checkpoint: bytes | None,
    ) -> RoundResult:
        outer = self.cfg.outer
        return RoundResult(
            run_id=self.run_id,
            round=self.round,
            selected=decision.scored,
            rejections=decision.rejections,
            base_state_hash=self.state_hash,
            patch_sha256=hashlib.sha256(patch).hexdigest(),
            patch_size=len(patch),
            new_state_hash=new_hash,
            master_before=before.fp32_hash,
            master_after=master_after,
            outer=OuterStep(lr=outer.lr, momentum=outer.momentum, nesterov=outer.nesterov, steps=before.steps),
            evidence=blob_ref(evidence),
            master_checkpoint=blob_ref(checkpoint) if checkpoint is not None else None,
        )

    def _next_book(self, standing: Standing, message_ids: Sequence[str], new_hash: str) -> Book:
        """The book of the next round: ratings, indicator averages, replay cache, recent states."""
        seen = SeenCache(self.cfg.seen_capacity, self.seen.ids())
        for message_id in message_ids:
            seen.add(message_id)
        return Book(
            round=self.round + 1,
            outer_steps=self.outer.steps,
            ratings=dict(standing.ratings.records),
            indicators=dict(standing.indicators),
            gained={m: list(r) for m, r in standing.gained.items()},
            since=dict(standing.since),
            waited=sorted(standing.waited),
            seen=seen.ids(),
            states=[*self.book.states, new_hash][-(self.cfg.behind_rounds + 1) :],
        )

    def _commit(
        self, book: Book, envelope: bytes, patch: bytes, evidence: bytes, weights: tuple[StateDict, str]
    ) -> None:
        """Write the state of the next round (state.py), then adopt it in memory (`weights`: the new
        BF16 weights and their hash, as the step made them)."""
        snap = Snapshot(book, self.outer.master, self.outer.state_tensors(), envelope, patch, evidence)
        self.store.commit(snap)
        self.previous_weights = self.weights
        self._adopt(book, envelope, patch, evidence, weights)


@dataclass(frozen=True)
class Step:
    """Where the outer optimizer stands: the FP32 state hash and the steps taken."""

    fp32_hash: str
    steps: int


def established_in(cfg: GauntletConfig, book: Book) -> Established:
    """The established miners of the round after `book` (`gauntlet.established`), each with its standing,
    from the book alone: the validator and a standby's replica (which has no ratings object) seat the
    same keys first, in the same order."""
    ratings = Ratings(cfg.openskill_beta, cfg.openskill_tau, cfg.missing_rounds, book.ratings)
    standing = Standing(ratings, book.indicators, {m: tuple(r) for m, r in book.gained.items()}, dict(book.since))
    keys = established(cfg, standing, book.round)
    return Established({m: seat_standing(standing, m, book.round) for m in keys})


def earning_in(cfg: GauntletConfig, book: Book) -> frozenset[str]:
    """The miners on their way to being established in the round after `book` (`gauntlet.earning_of`)."""
    return earning_of(cfg, book.gained, book.round)


def round_context(cfg: GauntletConfig, run_id: str, book: Book, state_hash: str, cap: int) -> RoundContext:
    """What the round after `book` checks submissions against (W_r: `state_hash`; `cap`: payload bytes);
    the same for the validator that closes the round and for every intake that takes its headers."""
    recent = book.states[:-1]
    earlier = {h: book.round - len(recent) + i for i, h in enumerate(recent) if h != state_hash}
    return RoundContext(
        run_id=run_id,
        round=book.round,
        state_hash=state_hash,
        earlier_states=earlier,
        codec=cfg.codec,
        assignment_batches=cfg.assignment_batches,
        max_payload_bytes=cap,
        max_submissions=cfg.max_submissions,
    )


def initial_snapshot(cfg: GauntletConfig, master: State) -> Snapshot:
    """The state of round 0: W_0 as the FP32 master, no momentum yet, nobody rated."""
    outer = OuterOptimizer(cfg.outer, master)
    book = Book(round=0, outer_steps=0, ratings={}, indicators={}, seen=[], states=[state_hash(outer.bf16_weights())])
    return Snapshot(book, outer.master, outer.state_tensors(), None, None)


def blob_ref(data: bytes) -> BlobRef:
    return BlobRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def fp32_checkpoint_bytes(state: State) -> bytes:
    """An FP32 state as a safetensors file (deterministic bytes for the same tensors)."""
    return save_tensors({name: t.contiguous() for name, t in state.items()})


def _log_report(report: RoundReport) -> None:
    for o in report.outcomes:
        who = (o.sender or "?")[:12]
        if o.status == "selected":
            log.debug("round %d: %s aggregated, final score %.4g", report.round, who, o.final or 0.0)
        else:
            log.debug("round %d: %s %s: %s", report.round, who, o.status, o.reason)
    log.info(
        "round %d: %d submissions, %d aggregated, state %s, patch %d bytes, %.2f s",
        report.round,
        len(report.outcomes),
        len(report.selected()),
        report.state_hash[:12],
        len(report.patch),
        report.seconds,
    )
