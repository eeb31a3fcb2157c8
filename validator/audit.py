"""Recomputing a round from public data: what an auditor checks, so nobody has to trust the validator.

    replica = Replica.from_snapshot(snap, cfg)       # an FP32 replica: from W_0, a signed FP32 checkpoint, or disk
    report = audit_round(replica, ctx, verified_result, evidence_bytes, payloads, patch)
    report.findings                                  # [] when the round is what its result says
    replica.snapshot(report, envelope)               # the next state, to commit (state.py) once it passed

An auditor holds the FP32 state the validator's step reads (the master, and the momentum when it
is on). For each round's signed result it checks, in this order (a `Finding` names what differs):

    start     the result starts from the replica: BF16 state hash, FP32 state hash, outer step
              count; its outer settings are the run's (`OuterStep`)
    evidence  the blob the result names (`evidence.py`) parses, is this round's, lists the result's
              selected submissions in the same order, and its revealed secret is the signer's
    headers   every named submission has its signed header; each aggregated one is signed by its
              sender, for this round and base state, with its payload's hash and size, the run's
              codec and the sender's data assignment, from a key that is not a validator's, once;
              a rejection whose reason the header alone decides (codec, base state, size,
              assignment) is rechecked
    payloads  each aggregated payload decodes; its norm is the one committed, bit for bit; the
              norm gate holds against the committed median; the clip factors are
              min(1, median of the norms / norm), exactly
    step      the clipped mean, in the committed order, then the outer step (both bit-reproducible,
              `aggregate.py`, `outer.py`), give the committed FP32 state hash and the BF16 state
              hash; the published book continues from them
    patch     the patch has the committed hash and takes W_r to the committed state

What it cannot check from public data: the evaluation scores (they need the validator's secret
batches; a miner recomputes its own once the round's secret is revealed, `pulse receipt`) and
what never reached the validator. The replica is stepped in place: after a finding it is not the
round's state any more, and the caller reloads its last committed snapshot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from protocol import pulsesync
from protocol.assignment import Assignment
from protocol.codec import default_max_bytes
from protocol.codec_options import build_codec
from protocol.errors import ProtocolError
from protocol.messages import RoundResult, SubmissionHeader
from protocol.signing import Verified, open_signed
from protocol.state import State
from protocol.statehash import state_hash
from validator.aggregate import aggregate, clip_scales, global_norm
from validator.config import GauntletConfig
from validator.evidence import Aggregated, RoundEvidence, public_book
from validator.gauntlet import NormReference, gate_median
from validator.outer import OuterOptimizer
from validator.scoring import RoundSecret
from validator.state import Book, Snapshot

PREFIX = "momentum/"


@dataclass(frozen=True)
class Finding:
    """One thing a round's result says that its inputs do not give."""

    what: str  # a short name: "start", "evidence", "header", "payload", "norm", "clip", "step", "state", "patch", ...
    detail: str

    def __str__(self) -> str:
        return f"{self.what}: {self.detail}"


@dataclass(frozen=True)
class AuditContext:
    """What an auditor knows of the run: its id, its validator keys, the validator's settings."""

    run_id: str
    validators: tuple[str, ...]
    cfg: GauntletConfig


@dataclass
class AuditReport:
    round: int
    findings: list[Finding] = field(default_factory=list)
    evidence: RoundEvidence | None = None
    new_weights: dict[str, torch.Tensor] | None = None  # BF16 W_{r+1}, when the step was recomputed
    patch: bytes | None = None  # the result's patch, checked (fetched, or re-encoded to the same bytes)

    @property
    def ok(self) -> bool:
        return not self.findings

    def add(self, what: str, detail: str) -> None:
        self.findings.append(Finding(what, detail))


class Replica:
    """The FP32 state the validator's step reads, its BF16 weights and the book it continues."""

    def __init__(self, outer: OuterOptimizer, book: Book) -> None:
        self.outer, self.book = outer, book
        self.weights = outer.bf16_weights()
        self.state_hash = state_hash(self.weights)
        self.fp32_hash = state_hash(outer.fp32_state())

    @classmethod
    def from_snapshot(cls, snap: Snapshot, cfg: GauntletConfig) -> Replica:
        outer = OuterOptimizer(cfg.outer, snap.master)
        outer.load_state_tensors(snap.momentum, snap.book.outer_steps)
        return cls(outer, snap.book)

    @classmethod
    def from_fp32(cls, state: Mapping[str, torch.Tensor], cfg: GauntletConfig, book: Book) -> Replica:
        """From an FP32 checkpoint (`Validator.fp32_checkpoint`): the master, and momentum buffers when on."""
        master = {n: t for n, t in state.items() if not n.startswith(PREFIX)}
        outer = OuterOptimizer(cfg.outer, master)
        momentum = {n: t for n, t in state.items() if n.startswith(PREFIX)}
        outer.load_state_tensors(momentum or outer.state_tensors(), book.outer_steps)
        return cls(outer, book)

    @property
    def round(self) -> int:
        return self.book.round

    def advance(self, new_weights: dict[str, torch.Tensor], fp32_hash: str, book: Book) -> None:
        """Hold W_{r+1}: the outer optimizer has stepped already; `book` is the round's published one."""
        self.weights, self.state_hash, self.fp32_hash, self.book = new_weights, state_hash(new_weights), fp32_hash, book

    def snapshot(self, envelope: bytes, patch: bytes | None, evidence: bytes) -> Snapshot:
        """The state this replica holds, as a validator commits it (`envelope`: the result that led here)."""
        return Snapshot(self.book, self.outer.master, self.outer.state_tensors(), envelope, patch, evidence)


def audit_round(
    replica: Replica,
    ctx: AuditContext,
    verified: Verified[RoundResult],
    evidence_bytes: bytes,
    payload: Callable[[Aggregated], bytes | None],
    patch: bytes | None,
) -> AuditReport:
    """Check round `replica.round`'s result against its inputs; on success the replica holds W_{r+1}."""
    result = verified.message
    report = AuditReport(result.round)
    _check_start(replica, ctx, result, report)
    evidence = _parse_evidence(ctx, verified, evidence_bytes, report)
    if evidence is None or not report.ok:
        return report
    report.evidence = evidence
    headers = _check_headers(replica, ctx, result, evidence, report)
    payloads = _fetch_payloads(evidence, payload, report)
    _check_clips(ctx.cfg, evidence, report)
    _check_median(ctx.cfg, replica, evidence, report)
    if not report.ok or payloads is None or headers is None:
        return report
    _recompute(replica, ctx.cfg, result, evidence, payloads, report)
    if report.ok and report.new_weights is not None:
        _check_patch(replica, result, report.new_weights, patch, report)
    if report.ok:
        _check_book(result, evidence.book, replica, report)
    if report.ok and report.new_weights is not None:
        replica.advance(report.new_weights, result.master_after, evidence.book)
    return report


# -- the checks, in order ------------------------------------------------------------------------


def _check_start(replica: Replica, ctx: AuditContext, result: RoundResult, report: AuditReport) -> None:
    if result.round != replica.round:
        report.add("start", f"result of round {result.round}, the replica holds round {replica.round}")
    if result.base_state_hash != replica.state_hash:
        report.add("start", f"starts from {result.base_state_hash[:12]}, W_r is {replica.state_hash[:12]}")
    if result.master_before != replica.fp32_hash:
        report.add("start", f"FP32 state before {result.master_before[:12]}, the replica's is {replica.fp32_hash[:12]}")
    outer, run = result.outer, ctx.cfg.outer
    if (outer.lr, outer.momentum, outer.nesterov) != (run.lr, run.momentum, run.nesterov):
        report.add("outer", f"lr {outer.lr}, momentum {outer.momentum}, nesterov {outer.nesterov}: the run fixes {run}")
    if outer.steps != replica.outer.steps:
        report.add("outer", f"{outer.steps} outer steps before this round, the replica has taken {replica.outer.steps}")


def _parse_evidence(
    ctx: AuditContext, verified: Verified[RoundResult], data: bytes, report: AuditReport
) -> RoundEvidence | None:
    result = verified.message
    if len(data) != result.evidence.size or hashlib.sha256(data).hexdigest() != result.evidence.sha256:
        report.add("evidence", "the evidence blob is not the one the result names")
        return None
    try:
        evidence = RoundEvidence.from_bytes(data)
        RoundSecret.revealed(bytes.fromhex(evidence.secret), verified.signed.sender, ctx.run_id, result.round)
    except ProtocolError as exc:
        report.add("evidence", f"{type(exc).__name__}: {exc}")
        return None
    if (evidence.run_id, evidence.round) != (ctx.run_id, result.round):
        report.add("evidence", f"evidence of run {evidence.run_id[:12]} round {evidence.round}")
    listed = [(a.sender, a.payload_sha256) for a in evidence.aggregated]
    if listed != [(s.sender, s.payload_sha256) for s in result.selected]:
        report.add("evidence", "the aggregated submissions are not the result's selected ones, in its order")
    return evidence


def _check_headers(
    replica: Replica, ctx: AuditContext, result: RoundResult, evidence: RoundEvidence, report: AuditReport
) -> dict[tuple[str, str], SubmissionHeader] | None:
    """Every named submission's signed header; the aggregated ones' claims, cheap rejections rechecked."""
    headers: dict[tuple[str, str], SubmissionHeader] = {}
    for text in evidence.headers:
        try:
            header = open_signed(bytes.fromhex(text), run_id=ctx.run_id, expect=SubmissionHeader).message
        except ProtocolError as exc:
            report.add("header", f"a header does not verify: {type(exc).__name__}: {exc}")
            return None
        headers[(header.sender, header.payload_sha256)] = header
    cap = ctx.cfg.max_payload_bytes or default_max_bytes(replica.weights)
    senders: set[str] = set()
    for entry in evidence.aggregated:
        found = headers.get((entry.sender, entry.payload_sha256))
        who = entry.sender[:12]
        if found is None:
            report.add("header", f"{who}: aggregated without its signed header")
            continue
        header = found
        problem = header_problem(header, replica.state_hash, ctx, result.round, cap)
        if problem is not None:
            report.add("header", f"{who}: aggregated, but {problem}")
        if header.payload_size != entry.payload_size:
            report.add("header", f"{who}: payload of {entry.payload_size} bytes, the header says {header.payload_size}")
        if entry.sender in ctx.validators:
            report.add("header", f"{who}: a validator key aggregated as a miner")
        if entry.sender in senders:
            report.add("header", f"{who}: aggregated twice")
        senders.add(entry.sender)
    for rejection in result.rejections:
        named = headers.get((rejection.sender, rejection.payload_sha256))
        if named is None:
            report.add("header", f"{rejection.sender[:12]}: rejected without its signed header")
        elif (claim := refuted_rejection(named, rejection.reason, replica.state_hash, ctx, cap)) is not None:
            report.add("rejection", f"{rejection.sender[:12]}: {claim}")
    return headers


def header_problem(header: SubmissionHeader, base: str, ctx: AuditContext, round_: int, cap: int) -> str | None:
    """Why a signed header could not be evaluated in round `round_` from state `base` (intake's own checks)."""
    if header.round != round_:
        return f"its header is for round {header.round}"
    if header.codec != ctx.cfg.codec:
        return f"its codec is {header.codec}, the run uses {ctx.cfg.codec}"
    if header.base_state_hash != base:
        return f"it trained from {header.base_state_hash[:12]}, not W_r"
    if header.payload_size > cap:
        return f"its payload of {header.payload_size} bytes is over the cap {cap}"
    if header.data_digest != Assignment(ctx.run_id, round_, header.sender, ctx.cfg.assignment_batches).digest:
        return "its data digest is not its assignment's"
    return None


def refuted_rejection(header: SubmissionHeader, reason: str, base: str, ctx: AuditContext, cap: int) -> str | None:
    """What contradicts a rejection whose reason its header alone decides (None: consistent, or not decidable)."""
    decided = {
        "codec ": header.codec != ctx.cfg.codec,
        "behind: ": header.base_state_hash != base,
        "unknown base state": header.base_state_hash != base,
        "oversize: ": header.payload_size > cap,
        "data digest ": header.data_digest
        != Assignment(ctx.run_id, header.round, header.sender, ctx.cfg.assignment_batches).digest,
    }
    for prefix, holds in decided.items():
        if reason.startswith(prefix) and not holds:
            return f"rejected ({reason}), but its signed header shows otherwise"
    return None


def _fetch_payloads(
    evidence: RoundEvidence, payload: Callable[[Aggregated], bytes | None], report: AuditReport
) -> list[bytes] | None:
    out = []
    for entry in evidence.aggregated:
        data = payload(entry)
        if data is None:
            report.add("payload", f"{entry.sender[:12]}: payload {entry.payload_sha256[:12]} is not fetchable")
            return None
        if len(data) != entry.payload_size or hashlib.sha256(data).hexdigest() != entry.payload_sha256:
            report.add("payload", f"{entry.sender[:12]}: the payload fetched is not {entry.payload_sha256[:12]}")
            return None
        out.append(data)
    return out


def _check_clips(cfg: GauntletConfig, evidence: RoundEvidence, report: AuditReport) -> None:
    """The norm gate against the committed median, and the clip factors from the committed norms, exactly."""
    median = evidence.median_norm
    for entry in evidence.aggregated:
        if median > 0 and entry.norm > cfg.norm_cap_multiple * median:
            report.add("norm", f"{entry.sender[:12]}: norm {entry.norm:.4g} is over the gate for median {median:.4g}")
        if entry.norm <= cfg.free_rider_fraction * median:
            report.add("norm", f"{entry.sender[:12]}: norm {entry.norm:.4g} is a free rider's for median {median:.4g}")
    if not evidence.aggregated:
        return
    norms = [a.norm for a in evidence.aggregated]
    clip_to, scales = clip_scales(norms)
    if clip_to != evidence.clip_to or scales != [a.clip for a in evidence.aggregated]:
        report.add("clip", f"clip factors {[a.clip for a in evidence.aggregated]}, the norms give {scales}")


def _check_median(cfg: GauntletConfig, replica: Replica, evidence: RoundEvidence, report: AuditReport) -> None:
    """The norm gate's median, recomputed as `gauntlet.inspect` takes it: from the committed norm of
    every distinct payload that decoded (`assessed`), weighted by the seniority its sender had in the
    book the round started from, or in a round without established senders by its committed
    `median_weight`. (The aggregated payloads' norms are checked against their bytes below; the
    rejected ones' payloads are not kept, so their committed norms and weights are taken as given.)"""
    reference = NormReference.of_book(cfg, replica.book.gained, replica.book.since, replica.round)
    senders: dict[str, set[str]] = {}
    norms: dict[str, float] = {}
    weights: dict[str, float | None] = {}
    for a in evidence.assessed:
        if a.norm is None:
            continue  # not measured: undecodable, or refused before inspection
        committed = (norms.setdefault(a.payload_sha256, a.norm), weights.setdefault(a.payload_sha256, a.median_weight))
        if committed != (a.norm, a.median_weight):
            report.add("median", f"payload {a.payload_sha256[:12]} is committed with two different norms or weights")
            return
        senders.setdefault(a.payload_sha256, set()).add(a.sender)
    measured: list[tuple[str | None, float]] = []
    committed_weights: list[float | None] = []
    for sha, who in senders.items():
        if len(set(reference.weights(sorted(who)))) > 1:
            return  # exact copies from keys of different standing: which came first is not public
        measured.append((next(iter(who)), norms[sha]))
        committed_weights.append(weights[sha])
    cold = reference.cold([s for s, _ in measured])
    if any((w is None) == cold for w in committed_weights):
        report.add("median", "median weights are committed exactly in a round without established senders: not so here")
        return
    median = gate_median(measured, reference, [w or 0.0 for w in committed_weights] if cold else None)
    if median != evidence.median_norm:
        said = evidence.median_norm
        report.add("median", f"the norm gate's median is committed as {said!r}; the committed norms give {median!r}")


def _recompute(
    replica: Replica,
    cfg: GauntletConfig,
    result: RoundResult,
    evidence: RoundEvidence,
    payloads: Sequence[bytes],
    report: AuditReport,
) -> None:
    """The clipped mean in the committed order, the outer step, and both state hashes."""
    codec = build_codec(cfg.codec, cfg.codec_options)
    cap = cfg.max_payload_bytes or default_max_bytes(replica.weights)
    measured: list[float] = []

    def decode(data: bytes) -> State:
        update = codec.decompress(data, replica.weights, max_bytes=cap)
        measured.append(global_norm(update))
        return update

    if payloads:
        try:
            mean = aggregate(payloads, decode, norms=[a.norm for a in evidence.aggregated])
        except ProtocolError as exc:
            report.add("payload", f"an aggregated payload does not decode: {type(exc).__name__}: {exc}")
            return
        for entry, norm in zip(evidence.aggregated, measured, strict=True):
            if norm != entry.norm:  # norms are bit-reproducible (`aggregate.global_norm`)
                report.add("norm", f"{entry.sender[:12]}: committed norm {entry.norm!r}, the payload's is {norm!r}")
        replica.outer.step(mean.update)
        del mean
    fp32_after = state_hash(replica.outer.fp32_state())
    if fp32_after != result.master_after:
        said = result.master_after[:12]
        report.add("step", f"the FP32 state after the step is {fp32_after[:12]}, the result says {said}")
    new_weights = replica.outer.bf16_weights()
    new_hash = state_hash(new_weights)
    if new_hash != result.new_state_hash:
        report.add("state", f"the step gives W_r+1 = {new_hash[:12]}, the result names {result.new_state_hash[:12]}")
    report.new_weights = new_weights


def _check_patch(
    replica: Replica, result: RoundResult, new_weights: State, patch: bytes | None, report: AuditReport
) -> None:
    """The published patch takes W_r to the committed state. Without it (nobody serves it any more) the
    patch is re-encoded: PULSESync is deterministic, so the same bytes prove the published one right."""
    if patch is None:
        report.patch = patch_for(replica, new_weights, result)
        return
    if len(patch) != result.patch_size or hashlib.sha256(patch).hexdigest() != result.patch_sha256:
        report.add("patch", "the patch fetched is not the one the result names")
        return
    try:
        patched = pulsesync.apply(replica.weights, patch)
    except ProtocolError as exc:
        report.add("patch", f"the published patch fails its checks: {type(exc).__name__}: {exc}")
        return
    if state_hash(patched) != state_hash(new_weights):
        report.add("patch", "the published patch does not give the state the step gives")
        return
    report.patch = patch


def _check_book(result: RoundResult, book: Book, replica: Replica, report: AuditReport) -> None:
    """The published book is the next round's, at the new state and outer step count."""
    if book.round != result.round + 1 or not book.states or book.states[-1] != result.new_state_hash:
        report.add("book", f"the published book is for round {book.round}, not the state of round {result.round + 1}")
    if book.outer_steps != replica.outer.steps:
        report.add("book", f"the book counts {book.outer_steps} outer steps, the replica {replica.outer.steps}")
    if book != public_book(book):
        report.add("book", "the published book carries a replay cache")


def patch_for(replica: Replica, new_weights: State, result: RoundResult) -> bytes | None:
    """The patch re-encoded from W_r to the recomputed W_{r+1}, if it is byte for byte the one the result
    names (PULSESync is deterministic): a standby serves it when the validator that made it is gone."""
    data = pulsesync.encode(replica.weights, new_weights, old_hash=replica.state_hash, new_hash=result.new_state_hash)
    return data if hashlib.sha256(data).hexdigest() == result.patch_sha256 else None
