"""The Gauntlet round: from a round's screened submissions to its decision, then the aggregate.

    intake (intake.py)     signature, run, round, replay, duplicate, codec, base hash, size, digest
    --- RoundPipeline.decide: the whole decision, from the state of round r ---
    inspect                decode each distinct payload once (spill.py keeps it on disk for the
                           rest of the round): finite, norm, sketch; the median norm of the
                           established miners' payloads (of all, when none sent one);
                           norm far above the median -> rejected, near zero -> free rider
    evaluate (scoring.py)  read back one at a time: gains on A and R, and those of the update's
                           reference (the mean direction of the others): indicator
    copies                 same payload hash or overlapping sketches: one owner, the rest copies
    standing               indicator moving averages; one OpenSkill match (ratings.py): evaluated
                           by score, everyone else last; the rounds each miner gained in
    select                 final = rating strength x max(indicator average, 0); the top G of the eligible
                           with a positive rating ordinal, filled up to `min_aggregated` from the rest
    outcomes               one per submission; the selected and rejected entries of the result
    --- RoundPipeline.aggregate ---
    aggregate              read back the selected one at a time, clip to their median norm, mean
    then (core.py)         outer step, BF16, PULSESync patch, signed RoundResult, commit (state.py)

`decide` changes nothing: it reads the miners' `Standing` of round r and returns the next one in
its `Decision`, which the validator commits with the new weights or not at all.

Memory: payloads stay compressed; at most one decoded update is in use at a time, beside the
round's sum of directions, the one reference built from it and the aggregate, so a round's peak
does not grow with the number of miners beyond their compressed bytes. Decoded updates read back
are memory-mapped from their spill file (at most `cfg.decoded_spill_bytes` of them on disk, deleted
by `close` when the round ends; what does not fit is decoded again), so a round decodes each
distinct payload once, not once per step.

Every submission gets exactly one `Outcome` in the local report. The signed result names every
submission whose sender is proven (see intake.py): aggregated with its final score, or rejected
with its reason. An expected peer failure is a rejection; an exception out of `run_round` is a bug
(or a full disk), after which the object must be dropped and the validator reopened from disk.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from protocol.assignment import Assignment
from protocol.codec import default_max_bytes
from protocol.codec_options import build_codec
from protocol.errors import ProtocolError
from protocol.messages import Rejection, ScoredSubmission
from protocol.state import State, StateDict
from validator.aggregate import Aggregate, aggregate, global_norm
from validator.config import GauntletConfig
from validator.intake import Candidate, Screened, reason_text
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
    alone: bool = False  # no other admissible update to build its reference from (see `select`)

    @property
    def index(self) -> int:
        return self.candidate.index

    @property
    def sender(self) -> str:
        return self.candidate.sender


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


@dataclass(frozen=True)
class Standing:
    """What the validator carries about miners from round to round (committed in the `Book`)."""

    ratings: Ratings
    indicators: Mapping[str, float]  # moving average of each miner's indicator
    gained: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Rounds (oldest first, within the last `established_window`) in which each miner's update
    gained on random data: who is established (`established`)."""


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
    directions: StateDict | None  # sum of update / norm over the distinct admissible updates
    kept: int  # how many updates that sum holds
    copies: dict[str, tuple[str, ...]]  # payload hash -> the other distinct payloads of its copy group


class RoundPipeline:
    """One round's decision and aggregate, from the weights W_r; keeps nothing between rounds."""

    def __init__(
        self,
        cfg: GauntletConfig,
        weights: State,
        evaluator: Evaluator,
        batch_fn: BatchFn,
        spill_dir: Path | None = None,
    ) -> None:
        self.cfg, self.weights, self.evaluator, self.batch_fn = cfg, weights, evaluator, batch_fn
        self.codec = build_codec(cfg.codec, cfg.codec_options)
        self.cap = cfg.max_payload_bytes or default_max_bytes(weights)
        self.spill = DecodedSpill(spill_dir, cfg.decoded_spill_bytes)

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
        inspection = self.inspect(screened.candidates, secret, established(self.cfg, standing, round_))
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
        last = [a.sender for a in inspection.assessments if a.problem is not None]
        last += [f.sender for f in screened.refusals if f.named and f.sender is not None]
        gains = [a.sender for a in evaluated if not a.copy and a.gains and a.gains.random > self.cfg.min_score]
        gained = record_gains(standing.gained, gains, round_, self.cfg.established_window)
        ratings = standing.ratings.rate(round_, ranked, last)
        # a key that never sent a useful update and sits matches out is forgotten (it would come
        # back as a newcomer, as a fresh key does for free): junk keys do not pile up in the book
        idle = [m for m, r in ratings.records.items() if round_ - r.last_round > self.cfg.missing_rounds]
        forget = {m for m in idle if m not in gained}
        kept = {m: v for m, v in indicators.items() if m not in forget}
        return Standing(ratings.without(forget), kept, gained)

    def decode(self, payload: bytes) -> StateDict:
        return self.codec.decompress(payload, self.weights, max_bytes=self.cap)

    def update_of(self, a: Assessment) -> StateDict:
        """`a`'s decoded update: read back from the spill, else its payload (read only then) decoded
        and spilled."""
        digest = a.candidate.header.payload_sha256
        update = self.spill.get(digest)
        if update is None:
            update = self.decode(a.candidate.payload)
            self.spill.put(digest, update)
        return update

    def inspect(
        self, candidates: Sequence[Candidate], secret: RoundSecret, established: frozenset[str] = frozenset()
    ) -> Inspection:
        """Decode each distinct payload once (finite, norm, sketch), then apply the norm limits.

        The limits are multiples of the median norm of the `established` miners' payloads (of every
        payload when none of them sent one): a majority of fresh keys must not move the reference
        that decides whether the honest updates are "99x the median" or free riders."""
        offset = secret.sketch_offset(self.cfg.sketch_stride)
        first: dict[str, Assessment] = {}  # payload hash -> its first submission
        out: list[Assessment] = []
        directions: StateDict | None = None  # sum of update / norm
        for c in candidates:
            out.append(a := Assessment(c))
            if c.header.payload_sha256 in first:
                continue  # an exact copy: judged with its original below
            first[c.header.payload_sha256] = a
            update = self._measure(a, offset)
            if update is not None and a.norm > 0:
                directions = _accumulate(directions, update, 1.0 / a.norm)
            del update  # invariant: one decoded update alive at a time
        distinct = [a for a in first.values() if a.problem is None]
        median = gate_median([(a.sender, a.norm) for a in distinct], established)
        for a in distinct:
            a.problem = self._norm_problem(a.norm, median)
            if a.problem is not None and a.norm > 0 and directions is not None:
                directions = _accumulate(directions, self.update_of(a), -1.0 / a.norm)
        for a in out:
            original = first[a.candidate.header.payload_sha256]
            a.norm, a.sketch, a.problem = original.norm, original.sketch, original.problem
        admissible = [a for a in distinct if a.problem is None and a.norm > 0]
        return Inspection(out, median, directions if admissible else None, len(admissible), self._copies(admissible))

    def _copies(self, admissible: Sequence[Assessment]) -> dict[str, tuple[str, ...]]:
        """Each admissible payload's near copies among the others (`copy_groups`), by payload hash."""
        items = [(a.candidate.header.payload_sha256, a.sketch) for a in admissible if a.sketch is not None]
        copies: dict[str, tuple[str, ...]] = {}
        for members in copy_groups(items, self.cfg.copy_overlap, self.cfg.copy_cosine):
            hashes = [items[i][0] for i in members]
            for h in hashes:
                copies[h] = tuple(other for other in hashes if other != h)
        return copies

    def _measure(self, a: Assessment, offset: int) -> StateDict | None:
        """Decode, norm and sketch one payload; the update, or None with `a.problem` set."""
        key = a.candidate.header.payload_sha256
        try:
            update = self.spill.get(key)
            if update is None:
                update = self.decode(a.candidate.payload)
        except ProtocolError as exc:
            a.problem = reason_text(f"undecodable: {type(exc).__name__}: {exc}")
            return None
        a.norm = global_norm(update)
        if not math.isfinite(a.norm):
            a.problem = "update norm overflows"
            return None
        a.sketch = Sketch.of(update, self.cfg.sketch_stride, offset)
        self.spill.put(key, update)  # read back by the steps after (a second put is a no-op)
        return update

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
        assigned = {a.index: self._assigned_batches(a.sender, secret, run_id, round_) for a in todo}
        randoms = [self.batch_fn(seed) for seed in secret.random_seeds(cfg.random_batches)]
        ev = RoundEvaluation(self.evaluator, self.weights, cfg.eval_step, randoms, assigned)
        for a in todo:
            update, reference = self._update_and_reference(a, inspection)
            scale = min(1.0, inspection.median / a.norm) if a.norm > 0 else 1.0
            a.gains = ev.gains(a.index, update, scale, reference)
            a.indicator = a.gains.indicator(cfg.indicator_margin)
            a.alone = reference is None
            del update, reference
        inspection.directions = None  # no longer needed: free it before the aggregate
        return todo

    def _update_and_reference(self, a: Assessment, inspection: Inspection) -> tuple[StateDict, StateDict | None]:
        """`a`'s decoded update and its reference update: the mean direction of the OTHER distinct
        admissible updates at the median norm (leave-one-out, scoring.py), leaving out its near copies
        too, which are the same work. None when no other update is left (a lone miner): the
        indicator is then the plain own-data check. Never two decoded updates alive at once: the
        copies are taken out of the sum before `a`'s own update is decoded."""
        digest = a.candidate.header.payload_sha256
        copies = inspection.copies.get(digest, ())
        others = inspection.kept - 1 - len(copies)
        if inspection.directions is None or others < 1 or a.norm <= 0:
            return self.update_of(a), None
        reference = {name: t.clone() for name, t in inspection.directions.items()}
        by_hash = {x.candidate.header.payload_sha256: x for x in inspection.assessments}
        for h in copies:
            _accumulate(reference, self.update_of(by_hash[h]), -1.0 / by_hash[h].norm)
        update = self.update_of(a)
        _accumulate(reference, update, -1.0 / a.norm)
        for t in reference.values():
            t.mul_(inspection.median / others)
        return update, reference

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
                a.gains.margin,
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
        return aggregate(list(selected), self.update_of, norms=[a.norm for a in selected])


def select(
    cfg: GauntletConfig,
    evaluated: Sequence[Assessment],
    ratings: Ratings,
    averages: Mapping[str, float],
) -> tuple[list[Assessment], dict[int, float], dict[int, str]]:
    """(selected in aggregation order, final score by index, reason by index for the evaluated ones not selected).

    Eligible: a positive score, an indicator average of at least `min_indicator_average`, and so a
    positive final score, `ratings.strength` x the average (the strength is exp(ordinal / beta):
    positive, in the ordinal's order). The top G of the eligible miners whose ordinal is positive are
    aggregated; a miner that has lost more than it has won (ordinal at most 0) only fills the seats
    up to `min_aggregated` that those leave empty. That keeps out what helps a little but ranks low
    round after round (ALIE, a thief whose own-data indicator came out +1 by chance) while a run of
    two miners still aggregates both: the ordinal alone as the factor turned the final score of
    whoever lost its first matches negative, and a run of two aggregated one miner or none.
    """
    finals: dict[int, float] = {}
    reasons: dict[int, str] = {}
    eligible: list[Assessment] = []
    ranked = [a for a in evaluated if not a.copy and a.gains is not None]
    for a in ranked:
        assert a.gains is not None  # `ranked` holds the evaluated ones only
        average = averages.get(a.sender, 0.0)
        # a lone update (no other admissible one this round) has no reference to measure its own-data
        # gain against and nobody to be ranked with: its score alone decides. A run starts with one
        # miner; it used to get indicator -1 every round and never trained.
        final = finals[a.index] = a.gains.random if a.alone else ratings.strength(a.sender) * max(average, 0.0)
        if not a.gains.random > cfg.min_score:
            reasons[a.index] = f"score {a.gains.random:.3g}: no gain on random data"
        elif not a.alone and average < cfg.min_indicator_average:
            reasons[a.index] = (
                f"indicator average {average:.3f} below {cfg.min_indicator_average} (this round {a.indicator:+d})"
            )
        elif not final > 0:
            reasons[a.index] = f"final score {final:.3g} is not positive"
        else:
            eligible.append(a)
    eligible.sort(key=lambda a: (-finals[a.index], a.index))
    rated = [a for a in eligible if ratings.ordinal(a.sender) > 0]
    unrated = [a for a in eligible if not ratings.ordinal(a.sender) > 0]
    chosen = rated[: cfg.top_g]
    filled = unrated[: max(0, min(cfg.min_aggregated, cfg.top_g) - len(chosen))]
    for rank, a in enumerate(rated[cfg.top_g :], start=cfg.top_g + 1):
        reasons[a.index] = f"final score {finals[a.index]:.4g} ranks {rank}, top {cfg.top_g} aggregated"
    for a in unrated[len(filled) :]:
        reasons[a.index] = (
            f"rating ordinal {ratings.ordinal(a.sender):.3g} is not positive and {len(chosen)} miners with a "
            f"positive one were aggregated (final score {finals[a.index]:.3g})"
        )
    return sorted(chosen + filled, key=lambda a: (-finals[a.index], a.index)), finals, reasons


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


def established(cfg: GauntletConfig, standing: Standing, round_: int) -> frozenset[str]:
    """Miners whose updates gained on random data in at least `established_rounds` of the
    `established_window` rounds before `round_`."""
    return established_of(cfg, standing.gained, round_)


def established_of(cfg: GauntletConfig, gained: Mapping[str, Sequence[int]], round_: int) -> frozenset[str]:
    """`established` from the rounds each miner gained (a book's `gained`: an auditor has no ratings object)."""
    oldest = round_ - cfg.established_window
    enough = cfg.established_rounds
    return frozenset(m for m, rounds in gained.items() if sum(1 for r in rounds if r >= oldest) >= enough)


def gate_median(measured: Sequence[tuple[str | None, float]], established: frozenset[str]) -> float:
    """The norm gate's reference: the median norm of the distinct payloads that decoded to a finite
    update (`measured`: (first sender, norm) each), those of `established` miners only when there are
    any (a majority of fresh keys must not move it); 0 with none."""
    reference = [norm for sender, norm in measured if sender in established] or [norm for _, norm in measured]
    return statistics.median(reference) if reference else 0.0


def _accumulate(total: StateDict | None, update: State, scale: float) -> StateDict:
    if total is None:
        return {name: t.mul(scale) for name, t in update.items()}
    for name, t in update.items():
        total[name].add_(t, alpha=scale)
    return total
