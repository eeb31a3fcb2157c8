"""The Gauntlet round: from a round's screened submissions to its decision, then the aggregate.

    intake (intake.py)     signature, run, round, replay, duplicate, codec, base hash, size, digest
    --- RoundPipeline.decide: the whole decision, from the state of round r ---
    inspect                decode each distinct payload once (newcomers' only up to their budget,
                           lowest ticket first: newcomers.py), the next ones ahead on their own
                           threads (decodeahead.py; spill.py keeps each on disk for the
                           rest of the round): finite, norm, sketch, cosine with the public
                           previous step; the norm gate's median (`gate_median`: the senior
                           miners', younger established ones capped; when none sent one, every
                           payload's weighted by its gain on R per unit of norm, and those of
                           no weight left out of the references);
                           norm far above the median -> rejected, near zero -> free rider;
                           a slice or rescaling of the public previous step -> a copy of it
    evaluate (scoring.py)  read back one at a time: gains on A and R, and those of the update's
                           reference (the mean direction of the others, established keys' only
                           when any sent one: fresh keys' noise cannot dilute it): indicator; an update
                           whose cosine with that mean is near 1 is built from it (ALIE): a copy
    copies                 same payload hash or overlapping sketches: one owner, the rest copies
    standing               indicator moving averages; one OpenSkill match (ratings.py): evaluated
                           by score, everyone else last; the rounds each miner earned standing in
                           (gain on R, own-data indicator +1, no copy: `earned`)
    select                 eligible: gain on R, own-data indicator +1 this round and on record, or
                           a steady record (`on_record`);
                           final = rating strength x indicator average orders them; the top G
    outcomes               one per submission; the selected and rejected entries of the result
    --- RoundPipeline.aggregate ---
    aggregate              read back the selected one at a time, clip to their median norm, mean
    then (core.py)         outer step, BF16, PULSESync patch, signed RoundResult, commit (state.py)

`decide` changes nothing: it reads the miners' `Standing` of round r and returns the next one in
its `Decision`, which the validator commits with the new weights or not at all.

Memory: payloads stay compressed; at most one decoded update is in use at a time (and at most
`cfg.decode_ahead` more waiting, decoded ahead during inspect), beside the round's sum of
directions (two while decoding: established keys' and newcomers'), the one reference built from it
and the aggregate, so a round's peak does not grow
with the number of miners beyond their compressed bytes. Decoded updates read back
are memory-mapped from their spill file (at most `cfg.decoded_spill_bytes` of them on disk, deleted
by `close` when the round ends; what does not fit is decoded again), so a round decodes each
distinct payload once, not once per step.

Every submission gets exactly one `Outcome` in the local report. The signed result names every
submission whose sender is proven (see intake.py): aggregated with its final score, or rejected
with its reason. An expected peer failure is a rejection; an exception out of `run_round` is a bug
(or a full disk), after which the object must be dropped and the validator reopened from disk.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch

from protocol.assignment import Assignment
from protocol.codec import default_max_bytes
from protocol.codec_options import build_codec
from protocol.errors import ProtocolError
from protocol.messages import Rejection, ScoredSubmission
from protocol.state import State, StateDict
from validator.aggregate import Aggregate, aggregate, global_norm
from validator.config import GauntletConfig
from validator.decodeahead import decode_ahead
from validator.intake import Candidate, Screened, reason_text
from validator.newcomers import NOT_EXAMINED, NewcomerBudget, examine_in_passes
from validator.ratings import Ratings
from validator.scoring import (
    Batch,
    BatchFn,
    CopyCandidate,
    Evaluator,
    Gains,
    RoundEvaluation,
    RoundSecret,
    Sketch,
    copy_groups,
    copy_owners,
    moving_average,
)
from validator.spill import DecodedSpill

log = logging.getLogger(__name__)


@dataclass
class Assessment:
    """What the round learns about one candidate; `problem` set means rejected and penalized."""

    candidate: Candidate
    norm: float = 0.0
    sketch: Sketch | None = None
    gains: Gains | None = None
    indicator: int = 0
    problem: str | None = None
    copy: bool = False
    public: float = 0.0  # cosine with the public previous step on the update's own positions
    echo: float = 0.0  # cosine with the mean of the round's other updates (its reference), on its positions
    alone: bool = False  # no other admissible update to build its reference from (see `select`)
    # its decode ran: it decoded whole, or failed only once its whole body was read (junk that fails
    # earlier costs little); what counts against a round's `newcomer_evaluations`
    decode_ran: bool = False
    unexamined: bool = False  # a newcomer beyond the round's `newcomer_evaluations`: not its fault
    # in a round no established key sent to: its weight in the norm gate's median (`gate_median`,
    # `RoundPipeline._median_weights`); None in other rounds
    median_weight: float | None = None

    @property
    def index(self) -> int:
        return self.candidate.index

    @property
    def sender(self) -> str:
        return self.candidate.sender

    @property
    def payload_sha256(self) -> str:
        return self.candidate.header.payload_sha256


@dataclass(frozen=True)
class Outcome:
    """The one outcome of one submission. 'ignored' ones are logged but not in the signed result."""

    index: int
    status: Literal["selected", "rejected", "ignored"]
    reason: str = ""
    sender: str | None = None
    payload_sha256: str | None = None
    score: float | None = None  # relative gain on random data
    final: float | None = None  # rating strength (ratings.py) x max(indicator average, 0)
    indicator: int = 0
    gains: Gains | None = None
    norm: float | None = None  # global L2 norm of the decoded update, if it decoded
    median_weight: float | None = None  # `Assessment.median_weight`


@dataclass(frozen=True)
class Standing:
    """What the validator carries about miners from round to round (committed in the `Book`)."""

    ratings: Ratings
    indicators: Mapping[str, float]  # moving average of each miner's indicator
    gained: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Rounds (oldest first, within the last `established_window`) in which each miner earned
    standing (`earned`): who is established (`established`)."""
    since: Mapping[str, int] = field(default_factory=dict)
    """The round each miner in `gained` first earned standing: its seniority (`NormReference`)."""
    waited: frozenset[str] = frozenset()
    """Senders of the payloads the round left unexamined (`NewcomerBudget`): next round's tickets
    come before fresh keys' (admission.py)."""


@dataclass(frozen=True)
class Decision:
    """Everything a round decides before the master moves."""

    outcomes: tuple[Outcome, ...]  # one per submission, in arrival order
    selected: tuple[Assessment, ...]  # to aggregate, best final score first: the aggregation order
    scored: tuple[ScoredSubmission, ...]  # the signed result's selected entries, in the same order
    rejections: tuple[Rejection, ...]  # ... and its rejected ones
    standing: Standing  # ratings and indicator averages after this round
    median_norm: float


@dataclass
class Inspection:
    assessments: list[Assessment]
    median: float
    directions: StateDict | None  # sum of update / norm over the reference's members
    members: frozenset[str]  # payload hashes of the admissible updates the references are made of
    copies: dict[str, tuple[str, ...]]  # payload hash -> the other distinct payloads of its copy group


class RoundStopped(Exception):
    """The round was told to stop (its node is shutting down) before it decided: nothing is kept."""


class RoundPipeline:
    """One round's decision and aggregate, from the weights W_r; keeps nothing between rounds."""

    def __init__(
        self,
        cfg: GauntletConfig,
        weights: State,
        evaluator: Evaluator,
        batch_fn: BatchFn,
        spill_dir: Path | None = None,
        previous: State | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        """`previous`: W_{r-1}, whose step to W_r every node knows (None: no such check this round).
        `stopping`: once set, the decision raises `RoundStopped` before its next payload (a decode
        or an evaluation takes seconds at a real size, a round minutes: Ctrl+C must not wait for it).

        The round works where the evaluator's model is (`evaluator.device`, the host when it has
        none, or when that device lacks the memory: `round_device`): W_r and W_{r-1} are copied
        there once, payloads decode there, and every norm,
        sketch, cosine, reference and the aggregate's sum are computed there, so on a GPU no
        decoded update crosses to the host except to be spilled, and the evaluator loads each
        update from device memory. The aggregate comes back to the host for the outer step. The
        norms and the aggregate are exact float64 sums in a fixed order (aggregate.py): the same
        bits on every device."""
        self.cfg, self.evaluator, self.batch_fn = cfg, evaluator, batch_fn
        self.device = round_device(torch.device(getattr(evaluator, "device", "cpu")), weights, cfg.decode_ahead)
        self.weights = _on(weights, self.device)
        self.previous = None if previous is None else _on(previous, self.device)
        self.codec = build_codec(cfg.codec, cfg.codec_options)
        self.cap = cfg.max_payload_bytes or default_max_bytes(weights)
        self.spill = DecodedSpill(spill_dir, cfg.decoded_spill_bytes)
        self.stopping = stopping
        self._evaluations: dict[bytes, RoundEvaluation] = {}  # round secret's signature -> its evaluation

    def _stop_point(self) -> None:
        if self.stopping is not None and self.stopping.is_set():
            raise RoundStopped("the round was stopped before its decision: the node is stopping")

    def close(self) -> None:
        """Delete the round's spilled updates."""
        self.spill.close()

    def __enter__(self) -> RoundPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def decide(
        self, screened: Screened, secret: RoundSecret, standing: Standing, *, run_id: str, round_: int
    ) -> Decision:
        """Inspect, evaluate, mark copies, rate, select: the round's outcomes and the next standing."""
        newcomers = replace(newcomer_budget(self.cfg, standing, round_), secret=secret.key("admission"))
        inspection = self.inspect(screened.candidates, secret, NormReference.of(self.cfg, standing, round_), newcomers)
        evaluated = self.evaluate(inspection, secret, run_id, round_)
        self.mark_copies(evaluated, standing)
        after = self.rate(round_, standing, screened, inspection, evaluated)
        selected, finals, reasons = select(self.cfg, evaluated, after.ratings, after.indicators)
        outcomes, scored, rejections = outcomes_and_result(
            screened, inspection.assessments, selected, finals, reasons, screened.total
        )
        return Decision(tuple(outcomes), tuple(selected), scored, rejections, after, inspection.median)

    def rate(
        self,
        round_: int,
        standing: Standing,
        screened: Screened,
        inspection: Inspection,
        evaluated: Sequence[Assessment],
    ) -> Standing:
        """Indicator averages of the evaluated, and one rating match: evaluated by score, the rest last."""
        indicators = dict(standing.indicators)
        for a in evaluated:
            if a.alone:  # its indicator is the plain check, too noisy to count (scoring.py): not recorded
                continue
            indicators[a.sender] = moving_average(indicators.get(a.sender, 0.0), a.indicator, self.cfg.indicator_decay)
        ranked = [(a.sender, a.gains.random) for a in evaluated if not a.copy and a.gains is not None]
        last = [a.sender for a in inspection.assessments if a.problem is not None and not a.unexamined]
        last += [f.sender for f in screened.refusals if f.named and f.sender is not None]
        earners = [a.sender for a in evaluated if earned(self.cfg, a)]
        gained = record_gains(standing.gained, earners, round_, self.cfg.established_window)
        ratings = standing.ratings.rate(round_, ranked, last)
        # a key that never earned standing and sits matches out is forgotten (it would come
        # back as a newcomer, as a fresh key does for free): junk keys do not pile up in the book
        idle = [m for m, r in ratings.records.items() if round_ - r.last_round > self.cfg.missing_rounds]
        forget = {m for m in idle if m not in gained}
        kept = {m: v for m, v in indicators.items() if m not in forget}
        since = seniority(standing, earners, round_, self.cfg.established_window)
        waited = frozenset(a.sender for a in inspection.assessments if a.unexamined and a.sender is not None)
        return Standing(ratings.without(forget), kept, gained, since, waited)

    def decode(self, payload: bytes) -> StateDict:
        return self.codec.decompress(payload, self.weights, max_bytes=self.cap)

    def update_of(self, a: Assessment) -> StateDict:
        """`a`'s decoded update: read back from the spill, else its payload (read only then) decoded
        and spilled."""
        update = self._decoded(a)
        self.spill.put(a.candidate.header.payload_sha256, update)  # a no-op when it came from the spill
        return update

    def inspect(
        self,
        candidates: Sequence[Candidate],
        secret: RoundSecret,
        reference: NormReference | None = None,
        newcomers: NewcomerBudget | None = None,
    ) -> Inspection:
        """Decode each distinct payload once (finite, norm, sketch), then apply the norm limits and
        the public-step check.

        The limits are multiples of `gate_median` over `reference` (every payload's, weighted by
        its gain on R per unit of norm, when nobody established sent one: `_median_weights`): a
        majority of fresh or newly established keys must not move the reference that decides
        whether the honest updates are "99x the median" or free riders.

        With `newcomers`, every payload an established key sent is decoded, and newcomers' payloads
        only until `newcomers.evaluations` of them decoded, lowest ticket first; the rest are
        rejected unexamined (`Assessment.unexamined`). Within each pass payloads decode in arrival
        order, so a round without more newcomers than that decodes exactly as without a budget."""
        offset = secret.sketch_offset(self.cfg.sketch_stride)
        out = [Assessment(c) for c in candidates]
        first: dict[str, Assessment] = {}  # payload hash -> its first submission
        senders: dict[str, list[str]] = {}  # payload hash -> every key that sent it
        for a in out:
            first.setdefault(a.payload_sha256, a)  # later exact copies: judged with it below
            senders.setdefault(a.payload_sha256, []).append(a.sender)
        # the references are the mean direction of the other updates of established keys: a flood of
        # fresh keys sending noise would otherwise make them noise, and with them the own-data
        # indicator of every honest miner (newcomers' updates count only in a round without any)
        trusted = {h for h, who in senders.items() if newcomers is None or newcomers.vouched(who)}
        sums: dict[bool, StateDict | None] = {True: None, False: None}  # trusted? -> sum of update / norm

        def keep(a: Assessment, update: StateDict, sign: float = 1.0) -> None:
            side = a.payload_sha256 in trusted
            sums[side] = _accumulate(sums[side], update, sign / a.norm)

        def examine(todo: list[Assessment]) -> list[bool]:
            self._measure_all(todo, offset, keep)
            return [a.decode_ran for a in todo]

        unexamined = examine_in_passes(list(first.values()), lambda a: senders[a.payload_sha256], newcomers, examine)
        spent = f"{NOT_EXAMINED}this round's {newcomers.evaluations if newcomers else 0} newcomer examinations"
        for a in unexamined:
            a.unexamined, a.problem = True, f"{spent} went to lower admission tickets (no penalty)"
        distinct = [a for a in first.values() if a.problem is None]
        reference = reference or NormReference()
        cold = bool(distinct) and reference.cold([a.sender for a in distinct])
        weights = self._median_weights(distinct, secret) if cold else None
        median = gate_median([(a.sender, a.norm) for a in distinct], reference, weights)
        for a in distinct:
            a.problem = self._norm_problem(a.norm, median) or self._public_problem(a)
            if a.norm > 0 and (a.problem is not None or a.median_weight == 0):
                keep(a, self.update_of(a), -1.0)  # out of the references: rejected, or of no weight
        for a in out:
            original = first[a.payload_sha256]
            a.norm, a.sketch, a.problem = original.norm, original.sketch, original.problem
            a.decode_ran, a.unexamined = original.decode_ran, original.unexamined
            a.median_weight = original.median_weight
        admissible = [a for a in distinct if a.problem is None and a.norm > 0]
        side = any(a.payload_sha256 in trusted for a in admissible)
        members = frozenset(
            a.payload_sha256 for a in admissible if (a.payload_sha256 in trusted) == side and a.median_weight != 0
        )
        directions = sums[side] if members else None
        sums.clear()  # the other side's sum is freed here
        return Inspection(out, median, directions, members, self._copies(admissible))

    def _measure_all(
        self, todo: Sequence[Assessment], offset: int, keep: Callable[[Assessment, StateDict], None]
    ) -> None:
        """Decode and measure `todo` in order, the next ones ahead on their own threads (decodeahead.py);
        each measured update with a positive norm goes to `keep`."""
        # closed on the way out, a stop's too: the decodes not started are cancelled, the others awaited
        with contextlib.closing(decode_ahead(self._decoded, list(todo), self.cfg.decode_ahead)) as ahead:
            for a, decoded in ahead:
                self._stop_point()
                update = self._measure(a, offset, decoded)
                if update is not None and a.norm > 0:
                    keep(a, update)
                del update, decoded  # invariant: one decoded update in use at a time (and `decode_ahead` waiting)

    def _evaluation(self, secret: RoundSecret) -> RoundEvaluation:
        """The round's loss measurements (scoring.py), shared by the norm gate and `evaluate`."""
        if secret.signature not in self._evaluations:
            randoms = [self.batch_fn(seed) for seed in secret.random_seeds(self.cfg.random_batches)]
            self._evaluations[secret.signature] = RoundEvaluation(
                self.evaluator, self.weights, self.cfg.eval_step, randoms, {}, self.cfg.useful_share
            )
        return self._evaluations[secret.signature]

    def _median_weights(self, distinct: Sequence[Assessment], secret: RoundSecret) -> list[float]:
        """Each payload's weight in the norm gate's median in a round no established key sent to
        (`Assessment.median_weight`): how much its direction helps, its gain on R at its own norm per
        unit of norm; 0 at or below `useful_share` of the round's typical one; near copies share one.

        Weighted equally, the round's own payloads set the median, and a flood of fresh keys
        whispering at a hundredth of the honest norm made every honest update "100x the median": a
        run started under such a flood never moved. Noise at any norm helps next to nothing per unit
        of norm (a thirtieth of an honest update here): below the bar, it weighs nothing. Per unit of
        norm, not the gain itself: a gain grows with the norm (an honest update sent at 24x its norm
        gains 12x more on R here), so one key shouting a trained update would outweigh every honest
        one and make them free riders. A direction cannot be sent at a second norm from a second key
        for a second weight either: near copies (`copy_groups`) share one weight. The public previous
        step, a good direction anyone has, weighs nothing (rejected as its copy; not measured). What
        weighs is a trained direction per key, as each key weighed before, less the noise.
        The cost is |R| forward passes a payload, kept for its evaluation at the same scale
        (`RoundEvaluation.random_gain`)."""
        ev, quality = self._evaluation(secret), []
        for a in distinct:
            self._stop_point()
            measured = a.norm > 0 and self._public_problem(a) is None
            gain = ev.random_gain(self.update_of(a), key=a.payload_sha256) if measured else 0.0
            quality.append(gain / a.norm if measured and math.isfinite(gain) and gain > 0 else 0.0)
        # the typical quality weighted by itself: the many small ones of a flood do not set it
        bar = self.cfg.useful_share * weighted_median([(q, q) for q in quality if q > 0])
        for a, q in zip(distinct, quality, strict=True):
            a.median_weight = q if q > bar else 0.0
        for group in self._copy_groups(distinct):
            for a in group:
                a.median_weight = (a.median_weight or 0.0) / len(group)
        return [a.median_weight or 0.0 for a in distinct]

    def _copies(self, admissible: Sequence[Assessment]) -> dict[str, tuple[str, ...]]:
        """Each admissible payload's near copies among the others (`copy_groups`), by payload hash."""
        copies: dict[str, tuple[str, ...]] = {}
        for group in self._copy_groups(admissible):
            hashes = [a.payload_sha256 for a in group]
            for h in hashes:
                copies[h] = tuple(other for other in hashes if other != h)
        return copies

    def _copy_groups(self, assessments: Sequence[Assessment]) -> list[list[Assessment]]:
        """The groups (two or more) of `assessments` whose sketches are near copies (`copy_groups`)."""
        sketched = [a for a in assessments if a.sketch is not None]
        items = [(a.payload_sha256, a.sketch) for a in sketched if a.sketch is not None]  # (typed: not None)
        return [
            [sketched[i] for i in group] for group in copy_groups(items, self.cfg.copy_overlap, self.cfg.copy_cosine)
        ]

    def _decoded(self, a: Assessment) -> StateDict:
        """`a`'s update: from the spill if it is there, else decoded from its payload."""
        update = self.spill.get(a.candidate.header.payload_sha256)
        return self.decode(a.candidate.payload) if update is None else _on(update, self.device)

    def _measure(self, a: Assessment, offset: int, decoded: Future[StateDict]) -> StateDict | None:
        """Norm and sketch one decoded payload; the update, or None with `a.problem` set."""
        key = a.candidate.header.payload_sha256
        try:
            update = decoded.result()
        except ProtocolError as exc:
            a.problem = reason_text(f"undecodable: {type(exc).__name__}: {exc}")
            a.decode_ran = exc.body_read
            return None
        a.decode_ran = True
        a.norm = global_norm(update)
        if not math.isfinite(a.norm):
            a.problem = "update norm overflows"
            return None
        a.sketch = Sketch.of(update, self.cfg.sketch_stride, offset)
        if self.previous is not None:
            a.public = public_cosine(update, self.previous, self.weights)
        self.spill.put(key, update)  # read back by the steps after (a second put is a no-op)
        return update

    def _public_problem(self, a: Assessment) -> str | None:
        if a.public >= self.cfg.public_copy_cosine:
            return f"copy of the public previous step: cosine {a.public:.3f} on its positions"
        return None

    def _norm_problem(self, norm: float, median: float) -> str | None:
        if median > 0 and norm > self.cfg.norm_cap_multiple * median:
            return f"norm {norm:.3g} is {norm / median:.0f}x the median {median:.3g}"
        if norm <= self.cfg.free_rider_fraction * median:
            return f"free rider: norm {norm:.3g} <= {self.cfg.free_rider_fraction} x the median {median:.3g}"
        return None

    def evaluate(self, inspection: Inspection, secret: RoundSecret, run_id: str, round_: int) -> list[Assessment]:
        """Gains and indicator of every admissible candidate, one decoded update at a time."""
        todo = [a for a in inspection.assessments if a.problem is None]
        if not todo:
            return []
        cfg = self.cfg
        ev = self._evaluation(secret)
        ev.assign({a.index: self._assigned_batches(a.sender, secret, run_id, round_) for a in todo})
        for a in todo:
            self._stop_point()
            update, reference = self._update_and_reference(a, inspection)
            scale = min(1.0, inspection.median / a.norm) if a.norm > 0 else 1.0
            # the members left out of the sum decide the reference: equal sets, the same update
            left_out = self._left_out(a, inspection)
            a.gains = ev.gains(a.index, update, scale, reference, reference_key=left_out, update_key=a.payload_sha256)
            a.indicator = a.gains.indicator(cfg.indicator_margin, cfg.useful_share)
            a.alone = reference is None
            if reference is not None and self._others(a, inspection) >= 2:
                a.echo = echo_cosine(update, reference)
                if a.echo >= cfg.echo_cosine:
                    a.problem, a.copy = f"copy of the round's other updates: cosine {a.echo:.3f} with their mean", True
            del update, reference
        inspection.directions = None  # no longer needed: free it before the aggregate
        return todo

    def _update_and_reference(self, a: Assessment, inspection: Inspection) -> tuple[StateDict, StateDict | None]:
        """`a`'s decoded update and its reference update: the mean direction of the OTHER distinct
        admissible updates of established keys (of every key in a round without one: `members`) at
        the median norm (leave-one-out, scoring.py), leaving out its near copies too, which are the
        same work. None when no other update is left (a lone miner): the
        indicator is then the plain own-data check. Never two decoded updates alive at once: the
        copies are taken out of the sum before `a`'s own update is decoded."""
        others = self._others(a, inspection)
        if inspection.directions is None or others < 1 or a.norm <= 0:
            return self.update_of(a), None
        reference = {name: t.clone() for name, t in inspection.directions.items()}
        by_hash = {x.candidate.header.payload_sha256: x for x in inspection.assessments}
        for h in inspection.copies.get(a.payload_sha256, ()):
            if h in inspection.members:
                _accumulate(reference, self.update_of(by_hash[h]), -1.0 / by_hash[h].norm)
        update = self.update_of(a)
        if a.payload_sha256 in inspection.members:
            _accumulate(reference, update, -1.0 / a.norm)
        for t in reference.values():
            t.mul_(inspection.median / others)
        return update, reference

    @staticmethod
    def _others(a: Assessment, inspection: Inspection) -> int:
        """How many distinct admissible updates `a`'s reference is made of (its near copies left out)."""
        return len(inspection.members) - len(RoundPipeline._left_out(a, inspection))

    @staticmethod
    def _left_out(a: Assessment, inspection: Inspection) -> frozenset[str]:
        """The reference's members left out of `a`'s reference: `a` itself and its near copies."""
        return inspection.members & {a.payload_sha256, *inspection.copies.get(a.payload_sha256, ())}

    def _assigned_batches(self, miner: str, secret: RoundSecret, run_id: str, round_: int) -> list[Batch]:
        """The sample of `miner`'s assigned batches the validator scores it on (secret, per round)."""
        batches = self.cfg.assignment_batches
        seeds = Assignment(run_id, round_, miner, batches).seeds
        return [
            self.batch_fn(seeds[j]) for j in secret.assigned_indices(miner, batches, self.cfg.scored_assigned_batches)
        ]

    def mark_copies(self, evaluated: Sequence[Assessment], standing: Standing) -> None:
        decay = self.cfg.indicator_decay
        items = [
            CopyCandidate(
                a.index,
                a.candidate.header.payload_sha256,
                a.sketch,
                a.gains.margin if a.gains.measured else -math.inf,  # it lost on R: last in a tie
                a.indicator,
                moving_average(standing.indicators.get(a.sender, 0.0), a.indicator, decay),
                standing.indicators.get(a.sender, 0.0),
            )
            for a in evaluated
            if a.sketch is not None and a.gains is not None
        ]
        owners = copy_owners(items, self.cfg.copy_overlap, self.cfg.copy_cosine, self.cfg.copy_owner_lead)
        sender = {a.index: a.sender for a in evaluated}
        for a in evaluated:
            if a.index in owners:
                a.problem, a.copy = f"copy of {sender[owners[a.index]][:16]}'s submission", True

    def aggregate(self, selected: Sequence[Assessment]) -> Aggregate | None:
        """The clipped mean of `selected`, in that order, from the norms the round measured (None: nothing)."""
        if not selected:
            return None
        done = aggregate(list(selected), self.update_of, norms=[a.norm for a in selected])
        return replace(done, update=_on(done.update, torch.device("cpu")))  # the outer step is the host's


def select(
    cfg: GauntletConfig,
    evaluated: Sequence[Assessment],
    ratings: Ratings,
    averages: Mapping[str, float],
) -> tuple[list[Assessment], dict[int, float], dict[int, str]]:
    """(selected in aggregation order, final score by index, reason by index for the evaluated ones not selected).

    Eligible, on evidence: a gain on random data above `min_score`, and a record of training on its
    own assignment (`on_record`): this round's own-data indicator +1 on an average of at least
    `min_indicator_average`, or a steady average whatever one round's noise says. What helps random
    data without being the sender's own work (ALIE, a thief, a copy or slice of someone's update)
    fails the indicator in about every other round, and its average stays near 0. The final score,
    `ratings.strength` x the average, orders the eligible and weighs nothing else: the top G are
    aggregated. A rating ranks miners against each other, so someone
    always has a losing record, honest or not; as a gate it would keep an honest miner out for good,
    so it only orders.
    """
    finals: dict[int, float] = {}
    reasons: dict[int, str] = {}
    eligible: list[Assessment] = []
    for a in (a for a in evaluated if not a.copy and a.gains is not None):
        assert a.gains is not None  # filtered above
        average = averages.get(a.sender, 0.0)
        # a lone update has no reference to measure its own-data gain against and nobody to be ranked
        # with: its score alone decides (alone there is nobody's work to take)
        final = finals[a.index] = a.gains.random if a.alone else ratings.strength(a.sender) * max(average, 0.0)
        if not a.gains.random > cfg.min_score:
            reasons[a.index] = f"score {a.gains.random:.3g}: no gain on random data"
        elif not a.alone and not on_record(cfg, average, a.indicator):
            reasons[a.index] = (
                f"indicator average {average:.3f}, this round {a.indicator:+d}: needs +1 and at least "
                f"{cfg.min_indicator_average}, or at least {cfg.steady_indicator_average}"
            )
        elif not final > 0:
            reasons[a.index] = f"final score {final:.3g} is not positive"
        else:
            eligible.append(a)
    eligible.sort(key=lambda a: (-finals[a.index], a.index))
    for rank, a in enumerate(eligible[cfg.top_g :], start=cfg.top_g + 1):
        reasons[a.index] = f"final score {finals[a.index]:.4g} ranks {rank}, top {cfg.top_g} aggregated"
    return eligible[: cfg.top_g], finals, reasons


def on_record(cfg: GauntletConfig, average: float, indicator: int) -> bool:
    """Whether an indicator record (the average with this round's `indicator`) makes a miner eligible:
    this round +1 on a record of at least `min_indicator_average`, or a steady record of at least
    `steady_indicator_average` whatever this round's indicator."""
    if average >= cfg.steady_indicator_average:
        return True
    return indicator > 0 and average >= cfg.min_indicator_average


def outcomes_and_result(
    screened: Screened,
    assessments: Sequence[Assessment],
    selected: Sequence[Assessment],
    finals: dict[int, float],
    reasons: dict[int, str],
    total: int,
) -> tuple[list[Outcome], tuple[ScoredSubmission, ...], tuple[Rejection, ...]]:
    """One outcome per input index; the selected and rejected entries of the signed result."""
    chosen = {a.index for a in selected}
    outcomes: dict[int, Outcome] = {}
    for r in screened.refusals:
        status: Literal["rejected", "ignored"] = "rejected" if r.named else "ignored"
        outcomes[r.index] = Outcome(r.index, status, reason_text(r.reason), r.sender, r.payload_sha256)
    for a in assessments:
        h = a.candidate.header.payload_sha256
        base = Outcome(
            a.index, "rejected", "", a.sender, h, a.gains.random if a.gains else None,
            finals.get(a.index), a.indicator, a.gains, a.norm if a.sketch is not None else None,
            a.median_weight,
        )  # fmt: skip
        if a.index in chosen:
            outcomes[a.index] = replace(base, status="selected")
        else:
            outcomes[a.index] = replace(base, reason=reason_text(a.problem or reasons.get(a.index, "not selected")))
    if sorted(outcomes) != list(range(total)):
        raise AssertionError("every submission must get exactly one outcome")
    ordered = [outcomes[i] for i in range(total)]
    scored = tuple(  # in aggregation order
        ScoredSubmission(sender=a.sender, payload_sha256=a.candidate.header.payload_sha256, score=finals[a.index])
        for a in selected
    )
    rejections = tuple(
        Rejection(sender=o.sender or "", payload_sha256=o.payload_sha256 or "", reason=o.reason)
        for o in ordered
        if o.status == "rejected"
    )
    return ordered, scored, rejections


def record_gains(
    gained: Mapping[str, tuple[int, ...]], senders: Sequence[str], round_: int, window: int
) -> dict[str, tuple[int, ...]]:
    """`gained` plus `round_` for each of `senders`, keeping the rounds within the last `window` (and
    a miner's newest one however old: a key that was ever useful is remembered, `established`
    counts only recent rounds)."""
    oldest = round_ - window + 1
    out = {m: tuple(r for r in rounds if r >= oldest) or rounds[-1:] for m, rounds in gained.items()}
    for m in senders:
        out[m] = (*out.get(m, ()), round_)
    return out


def earned(cfg: GauntletConfig, a: Assessment) -> bool:
    """Whether `a` earns its sender a round of standing: its update gained on random data, was no copy
    (of the public previous step, which leaves it unevaluated, or of a peer's payload, found after
    its evaluation), and its own-data indicator was +1 (a lone update: its gain alone, there is
    nobody's work to take).
    A slice of a public step gains on random data but favours no one's assignment."""
    gained = a.gains is not None and a.gains.random > cfg.min_score
    return gained and not a.copy and a.problem is None and (a.alone or a.indicator > 0)


def seniority(standing: Standing, earners: Sequence[str], round_: int, window: int) -> dict[str, int]:
    """Each earner's first round of standing: kept while it earns within every `window` rounds, this
    round for a key that earns for the first time or after a lapse (a key cannot age while away)."""
    since = dict(standing.since)
    for m in earners:
        last = standing.gained.get(m, ())
        if m not in since or not last or last[-1] < round_ - window:
            since[m] = round_
    return {m: r for m, r in since.items() if m in standing.gained or m in earners}


def seat_standing(standing: Standing, miner: str, round_: int) -> float:
    """A miner's standing for a seat (admission.py): the rounds since it first earned standing."""
    return float(round_ - standing.since.get(miner, round_))


def newcomer_budget(cfg: GauntletConfig, standing: Standing, round_: int) -> NewcomerBudget:
    """Round `round_`'s bound on newcomers' examinations (newcomers.py), its tickets still unkeyed."""
    earning = earning_of(cfg, standing.gained, round_)
    return NewcomerBudget(established(cfg, standing, round_), earning, cfg.newcomer_evaluations, waited=standing.waited)


def established(cfg: GauntletConfig, standing: Standing, round_: int) -> frozenset[str]:
    """Miners that earned standing in at least `established_rounds` of the `established_window`
    rounds before `round_`."""
    return established_of(cfg, standing.gained, round_)


def _recent_earnings(cfg: GauntletConfig, gained: Mapping[str, Sequence[int]], round_: int) -> dict[str, int]:
    """Each miner's rounds of earned standing within the `established_window` rounds before `round_`."""
    oldest = round_ - cfg.established_window
    return {m: sum(1 for r in rounds if r >= oldest) for m, rounds in gained.items()}


def earning_of(cfg: GauntletConfig, gained: Mapping[str, Sequence[int]], round_: int) -> frozenset[str]:
    """Miners that earned standing in the `established_window` rounds before `round_`, but in fewer
    than `established_rounds`: on their way, with the same work a fresh key has not done (a newcomer
    seat before any fresh key's, admission.py)."""
    counts = _recent_earnings(cfg, gained, round_)
    return frozenset(m for m, n in counts.items() if 0 < n < cfg.established_rounds)


def established_of(cfg: GauntletConfig, gained: Mapping[str, Sequence[int]], round_: int) -> frozenset[str]:
    """`established` from the rounds each miner earned (a book's `gained`: an auditor has no ratings object)."""
    counts = _recent_earnings(cfg, gained, round_)
    return frozenset(m for m, n in counts.items() if n >= cfg.established_rounds)


@dataclass(frozen=True)
class NormReference:
    """Whose norms set the norm gate's median, and with what weight (`gate_median`)."""

    established: frozenset[str] = frozenset()
    senior: frozenset[str] = frozenset()  # established for at least `senior_rounds`
    young_share: float = 0.5  # the younger established together weigh at most this many seniors

    @classmethod
    def of(cls, cfg: GauntletConfig, standing: Standing, round_: int) -> NormReference:
        return cls.of_book(cfg, standing.gained, standing.since, round_)

    @classmethod
    def of_book(
        cls, cfg: GauntletConfig, gained: Mapping[str, Sequence[int]], since: Mapping[str, int], round_: int
    ) -> NormReference:
        settled = established_of(cfg, gained, round_)
        senior = frozenset(m for m in settled if round_ - since.get(m, round_) >= cfg.senior_rounds)
        return cls(settled, senior, cfg.young_median_share)

    def cold(self, senders: Sequence[str | None]) -> bool:
        """No established miner among `senders`: the round's own payloads set the median."""
        return not any(s in self.established for s in senders)

    def weights(self, senders: Sequence[str | None], cold_weights: Sequence[float] | None = None) -> list[float]:
        """Each sender's weight in the median: seniors 1, younger established ones their capped share,
        others 0; when no senior (or no established miner) is among `senders`, equal weights over the
        established ones (over all, or `cold_weights` when any is positive: `cold`)."""
        seniors = sum(1 for s in senders if s in self.senior)
        young = sum(1 for s in senders if s in self.established and s not in self.senior)
        if seniors:
            each = min(1.0, self.young_share * seniors / young) if young else 0.0
            return [1.0 if s in self.senior else each if s in self.established else 0.0 for s in senders]
        if young:
            return [1.0 if s in self.established else 0.0 for s in senders]
        if cold_weights is not None and any(w > 0 for w in cold_weights):
            return [max(w, 0.0) for w in cold_weights]
        return [1.0] * len(senders)


def gate_median(
    measured: Sequence[tuple[str | None, float]],
    reference: NormReference,
    cold_weights: Sequence[float] | None = None,
) -> float:
    """The norm gate's reference: the weighted median norm (`NormReference.weights`) of the distinct
    payloads that decoded to a finite update (`measured`: (first sender, norm) each); 0 with none.
    Keys that earned standing lately, however many, hold at most `young_share` seniors' weight; in a
    round without established keys, each payload weighs its `cold_weights` entry (`RoundPipeline._median_weights`)."""
    senders = [s for s, _ in measured]
    weighted = [(norm, w) for (_, norm), w in zip(measured, reference.weights(senders, cold_weights), strict=True)]
    return weighted_median([(n, w) for n, w in weighted if w > 0])


def weighted_median(items: Sequence[tuple[float, float]]) -> float:
    """The value at half the total weight ((value, weight) pairs; the mean of the two values at an
    exact half, so equal weights give `statistics.median`); 0 with none."""
    if not items:
        return 0.0
    if len({w for _, w in items}) == 1:
        return statistics.median(v for v, _ in items)
    ordered = sorted(items)
    half, cumulative = sum(w for _, w in ordered) / 2, 0.0
    for i, (value, weight) in enumerate(ordered):
        cumulative += weight
        if math.isclose(cumulative, half) and i + 1 < len(ordered):
            return (value + ordered[i + 1][0]) / 2
        if cumulative > half:
            return value
    return ordered[-1][0]


def public_cosine(update: State, previous: State, weights: State) -> float:
    """Cosine between `update` and the public step previous - weights, both taken on the positions
    `update` sends (nonzero): 1 for any slice of that step at any scale. One tensor at a time."""
    return support_cosine(update, lambda name, sent: previous[name][sent].double() - weights[name][sent].double())


def echo_cosine(update: State, reference: State) -> float:
    """Cosine between `update` and its reference (the mean of the round's others) on `update`'s positions."""
    return support_cosine(update, lambda name, sent: reference[name][sent])


def support_cosine(update: State, direction: Callable[[str, torch.Tensor], torch.Tensor]) -> float:
    """Cosine between `update` and a direction, both taken on the positions `update` sends (nonzero):
    `direction(name, mask)` gives the direction's values of tensor `name` at `mask`."""
    dot = mine = theirs = 0.0
    for name, t in update.items():
        sent = t != 0
        u = t[sent].double()
        d = direction(name, sent).double()
        dot, mine, theirs = dot + float(u @ d), mine + float(u @ u), theirs + float(d @ d)
    return dot / math.sqrt(mine * theirs) if mine > 0 and theirs > 0 else 0.0


def round_device(device: torch.device, weights: State, ahead: int) -> torch.device:
    """Where a round works: the evaluator's device if its free memory holds what the round keeps
    there (W_r and W_{r-1}, and in FP32 the two sums of directions, a reference, the update in use
    and `ahead` decoded ahead), else the host, said in the log. A 24 GB card evaluating a 1.5B model
    has room for the model, not for those (about 40 GB)."""
    if device.type != "cuda":
        return device
    elements = sum(t.numel() for t in weights.values())
    needed = 2 * sum(t.numel() * t.element_size() for t in weights.values()) + 4 * elements * (4 + ahead)
    free, _ = torch.cuda.mem_get_info(device)
    if free >= needed * 1.1:  # a margin for the evaluator's activations and the allocator's blocks
        return device
    log.warning(
        "the round works on the host: %s has %.1f GiB free, the round would keep %.1f GiB there",
        device, free / 2**30, needed / 2**30,
    )  # fmt: skip
    return torch.device("cpu")


def _on(state: State, device: torch.device) -> StateDict:
    """`state` with every tensor on `device` (the same tensors where they already are)."""
    return {name: t.to(device) for name, t in state.items()}


def _accumulate(total: StateDict | None, update: State, scale: float) -> StateDict:
    if total is None:
        return {name: t.mul(scale) for name, t in update.items()}
    for name, t in update.items():
        total[name].add_(t, alpha=scale)
    return total
