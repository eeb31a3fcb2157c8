"""Standing that must be earned, and selection on evidence: in-process rounds against the real `Validator`.

- slices of the public previous step, ALIE, a thief and a copycat earn no standing and are never
  aggregated, while the honest miners are;
- keys that earned standing lately, however many, do not move the norm gate's median;
- every honest miner of a three-miner field is aggregated (a rating ranks, it does not lock out).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import torch

from node.bench.arena import Arena
from node.swarm.fakeminers import FreshNoise, RoundView, identity_for
from node.swarm.fakestanding import Alie, PublicSlice, Uncorrected, Whisper
from tests.fakeswarm import RUN_ID, make_swarm
from validator.config import GauntletConfig
from validator.gauntlet import Assessment, NormReference, RoundPipeline, Standing, gate_median, select
from validator.intake import Candidate, Submission, screen
from validator.ratings import Ratings
from validator.scoring import Gains, RoundSecret, moving_average

SLICES = 40


def _assessed(index: int, sender: str, score: float, indicator: int = 1) -> Assessment:
    candidate = cast(Candidate, SimpleNamespace(index=index, sender=sender))
    return Assessment(candidate, norm=1.0, gains=Gains(score, score, 0.0, 0.0), indicator=indicator)


def test_a_losing_record_orders_but_does_not_lock_out() -> None:
    """Of four useful miners with own-data evidence, the one that lost every match is still aggregated
    (last); a miner whose own-data indicator is -1 this round is not, on a record short of steady."""
    field = [("a", 0.5), ("c", 0.4), ("d", 0.3), ("b", 0.1)]
    ratings = Ratings(7.0, 0.1, 2, {}).rate(0, field, []).rate(1, field, [])
    assert ratings.ordinal("b") < 0
    cfg = GauntletConfig(min_indicator_average=0.05)
    evaluated = [_assessed(i, m, score) for i, (m, score) in enumerate(field)]
    selected, finals, reasons = select(cfg, evaluated, ratings, dict.fromkeys("abcd", 0.15))
    assert [a.sender for a in selected] == ["a", "c", "d", "b"] and not reasons
    assert finals[0] > finals[3] > 0
    evaluated[0] = _assessed(0, "a", 0.5, indicator=-1)
    selected, _, reasons = select(cfg, evaluated, ratings, dict.fromkeys("abcd", 0.15))
    assert "a" not in [s.sender for s in selected] and reasons[0].startswith("indicator average 0.150, this round -1")
    selected, _, reasons = select(
        cfg.model_copy(update={"top_g": 2}), evaluated[1:], ratings, dict.fromkeys("cdb", 0.15)
    )
    assert [a.sender for a in selected] == ["c", "d"] and "ranks 3" in reasons[3]


def test_three_honest_miners_are_each_aggregated(tmp_path: Path) -> None:
    """Three honest miners, seven rounds: from the round their indicator average qualifies (round 2),
    each is aggregated in every round. The rating used to gate: the loser of the first matches had an
    ordinal below 0 and was left out of rounds 2-6 while the two others filled `min_aggregated`."""
    swarm = make_swarm()
    honest = swarm.honest(3)
    arena = Arena(swarm.validator(tmp_path), honest)
    for _ in range(7):
        arena.play()
    used = Counter(arena.records[r].senders[o.index] for r in range(2, 7) for o in arena.records[r].report.selected())
    reasons = [o.reason for rec in arena.records[2:] for o in rec.report.outcomes if o.status != "selected"]
    assert all(used[m.key] >= 4 for m in honest), (used, reasons)


@pytest.fixture(scope="module")
def sliced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Arena, list[str], dict[str, str]]:
    """Three honest miners for three rounds, then 40 keys each sending a disjoint slice of the public
    previous step at the honest median norm, beside ALIE, a thief and a copycat, for three rounds.
    Every newcomer is examined (test_newcomers.py bounds how many are)."""
    swarm = make_swarm(newcomer_evaluations=128)
    honest = swarm.honest(3)
    arena = Arena(swarm.validator(tmp_path_factory.mktemp("sliced")), honest)
    for _ in range(3):
        arena.play()
    norm = arena.records[-1].report.median_norm
    slicers = [PublicSlice(swarm.setup, identity_for(f"slice/{i}"), i, SLICES, norm) for i in range(SLICES)]
    others = [Alie(swarm.setup, identity_for("alie")), *swarm.adversaries(("thief", "copycat"), [honest[0].key])]
    arena.miners = [*honest, *slicers, *others]
    for _ in range(3):
        arena.play()
    kinds = {m.key: m.kind for m in arena.miners}
    return arena, [m.key for m in honest], kinds


def test_slices_of_the_public_step_earn_no_standing(sliced: tuple[Arena, list[str], dict[str, str]]) -> None:
    """Every slice gains on random data and shares no position with another, yet each is named a copy
    of the public step, is never aggregated and never becomes established; nor do ALIE, the thief or
    the copycat. The honest miners stay established and aggregated. (A gain on random data used to be
    enough: all 40 keys were established after one round.)"""
    arena, honest, kinds = sliced
    established = arena.validator.established()
    assert set(honest) <= established and established <= set(honest)
    for rec in arena.records[3:]:
        selected = {rec.senders[o.index] for o in rec.report.selected()}
        assert selected and selected <= set(honest), [kinds[s] for s in selected]
        for o in rec.report.outcomes:
            if kinds[rec.senders[o.index]] == "publicslice":
                assert o.reason.startswith("copy of the public previous step"), o.reason
    assert all(not arena.validator.book.gained.get(k) for k, kind in kinds.items() if kind != "honest")


def test_keys_that_earned_standing_lately_do_not_move_the_median(tmp_path: Path) -> None:
    """40 keys established two rounds ago (young) send random updates at 1/100 of the honest norm beside
    three senior honest miners: the median stays the seniors', the whispers are free riders and the
    honest updates are aggregated. (Over every established key, the median fell 100x and every honest
    update was "151x the median".)"""
    swarm = make_swarm(senior_rounds=3)
    honest = swarm.honest(3)
    arena = Arena(swarm.validator(tmp_path), honest)
    for _ in range(3):
        honest_norm = arena.play().report.median_norm
    v = arena.validator
    whispers = [Whisper(swarm.setup, identity_for(f"young/{i}"), honest_norm / 100) for i in range(SLICES)]
    arena.miners = [*honest, *whispers]
    subs, kinds, _ = arena.submissions()
    young = {w.key: (v.round - 2, v.round - 1) for w in whispers}
    standing = replace(
        v.standing(),
        gained={**v.standing().gained, **young},
        since={**v.standing().since, **{k: v.round - 2 for k in young}},
    )
    reference = NormReference.of(v.cfg, standing, v.round)
    assert reference.senior == frozenset(m.key for m in honest) and len(reference.established) == 43
    pipeline = RoundPipeline(v.cfg, v.weights, v.evaluator, v.batch_fn, previous=v.previous_weights)
    screened = screen(subs, v.context(pipeline), v.seen)
    secret = RoundSecret.derive(identity_for("validator"), RUN_ID, v.round)
    decision = pipeline.decide(screened, secret, standing, run_id=RUN_ID, round_=v.round)
    assert abs(decision.median_norm - honest_norm) < 0.5 * honest_norm
    by_kind = [(kinds[o.index], o) for o in decision.outcomes]
    assert all(o.reason.startswith("free rider") for kind, o in by_kind if kind == "whisper")
    assert {kind for kind, o in by_kind if o.status == "selected"} == {"honest"}
    assert sum(o.status == "selected" for _, o in by_kind) >= 2


def test_the_young_hold_at_most_their_share_of_the_median() -> None:
    reference = NormReference(frozenset("abcxyz"), frozenset("abc"), 0.5)
    seniors = [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    young = [(f"{k}", 0.01) for k in "xyz"] * 20
    assert gate_median(seniors, reference) == 2.0
    assert 1.0 <= gate_median([*seniors, *young], reference) < 2.0  # pulled at most to the seniors' quartile
    assert gate_median([("x", 0.01), ("y", 0.02), ("q", 5.0)], reference) == pytest.approx(0.015)  # no senior here
    assert gate_median([("q", 5.0), ("r", 7.0)], reference) == 6.0  # nobody established here


def test_alie_is_a_copy_of_the_others_mean_and_honest_updates_are_not(tmp_path: Path) -> None:
    """ALIE (mean - std of the round's honest updates) lies along the mean of the others: it is named a
    copy of them, not left to the luck of its own-data indicator. Honest updates stay well below the
    threshold (0.48-0.84 measured against 0.88-0.96 for ALIE)."""
    swarm = make_swarm()
    honest = swarm.honest(5)
    arena = Arena(swarm.validator(tmp_path), [*honest, Alie(swarm.setup, identity_for("alie"))])
    for _ in range(4):
        arena.play()
    outcomes = [(rec.kinds[o.index], o) for rec in arena.records for o in rec.report.outcomes]
    echo = "copy of the round's other updates"
    assert not [o.reason for kind, o in outcomes if kind == "honest" and o.reason.startswith(echo)]
    assert all(o.status != "selected" for kind, o in outcomes if kind == "alie")
    assert sum(o.reason.startswith(echo) for kind, o in outcomes if kind == "alie") >= 3


def test_a_reopened_validator_knows_the_public_step(tmp_path: Path) -> None:
    """The public-step check survives a restart: W_{r-1} is read back from the previous round's folder."""
    swarm = make_swarm()
    arena = Arena(swarm.validator(tmp_path), swarm.honest(1))
    assert arena.validator.previous_weights is None
    for _ in range(2):
        arena.play()
    before = arena.validator.previous_weights
    assert before is not None
    again = swarm.reopen(tmp_path).previous_weights
    assert again is not None and all(torch.equal(again[n], before[n]) for n in before)


def _record(indicators: list[int], decay: float) -> float:
    average = 0.0
    for i in indicators:
        average = moving_average(average, i, decay)
    return average


def test_a_bad_start_fades_and_a_steady_record_outlasts_a_noisy_round() -> None:
    """An honest miner whose first indicators came out -1 qualifies after three +1 rounds, as a fresh
    key would (the average is floored at 0, not dug into a hole); a miner with six +1 rounds in a row
    stays in through a -1 round; a record like a thief's (one +1 round in four) never gets there."""
    cfg = GauntletConfig()
    ratings = Ratings(7.0, 0.1, 2, {})

    def chosen(indicators: list[int]) -> bool:
        average = _record(indicators, cfg.indicator_decay)
        selected, _, _ = select(cfg, [_assessed(0, "m", 0.3, indicator=indicators[-1])], ratings, {"m": average})
        return bool(selected)

    assert _record([-1, -1, -1, -1], cfg.indicator_decay) == 0.0
    assert chosen([-1, -1, -1, -1, 1, 1, 1])
    assert not chosen([-1, -1, -1, -1, 1, 1])
    assert chosen([1] * 6 + [-1])
    assert not chosen([1] * 5 + [-1]) and not chosen([1] * 3 + [-1])
    thief = [1, -1, -1, -1] * 6 + [1, 1, -1, 1, -1]
    assert not any(chosen(thief[: n + 1]) for n in range(len(thief))), "a one-in-four record is never eligible"


def test_cold_weights_decide_the_median_of_a_round_without_established_keys() -> None:
    """Without established senders each payload weighs its cold weight (what its direction does on R):
    30 whispers of next to no weight do not move the median off the three that weigh; with no weight
    anywhere the weights are equal, as with none given; with an established sender they are unused."""
    measured = [*((f"h{i}", 1.0 + i / 10) for i in range(3)), *((f"w{i}", 0.01) for i in range(30))]
    gains = [0.02, 0.03, 0.025, *([1e-6] * 15), *([0.0] * 15)]
    reference = NormReference()
    assert reference.cold([s for s, _ in measured])
    assert gate_median(measured, reference, gains) == pytest.approx(1.1)
    assert gate_median(measured, reference) == pytest.approx(0.01)
    assert gate_median(measured, reference, [0.0] * 3 + [-0.5] * 30) == pytest.approx(0.01)
    established = NormReference(frozenset({"w0"}))
    assert not established.cold([s for s, _ in measured])
    assert gate_median(measured, established, gains) == pytest.approx(0.01)  # the established key's own


def test_a_run_started_under_a_whisper_flood_moves(tmp_path: Path) -> None:
    """From the very first round 24 fresh keys send random updates at 1/100 of the honest norm beside
    three honest miners, every key examined. No key is established, so the round's own payloads set
    the median: weighted by their gain on R, it is the honest miners'; the whispers are free riders
    and the honest updates are aggregated from round 2, as without the flood. (Weighted equally, the
    median was the whispers', every honest update was "100x the median", and the run never moved.)"""
    quiet = make_swarm()
    probe = Arena(quiet.validator(tmp_path / "quiet"), quiet.honest(3))
    honest_norm = probe.play().report.median_norm
    swarm = make_swarm(newcomer_evaluations=128)
    honest = swarm.honest(3)
    whispers = [Whisper(swarm.setup, identity_for(f"cold/{i}"), honest_norm / 100) for i in range(24)]
    arena = Arena(swarm.validator(tmp_path / "flooded"), [*honest, *whispers])
    kinds = {m.key: m.kind for m in arena.miners}
    for _ in range(3):
        arena.play()
    for rec in arena.records:
        norms = [o.norm or 0.0 for o in rec.report.outcomes if kinds[rec.senders[o.index]] == "honest"]
        assert min(norms) <= rec.report.median_norm <= max(norms), (rec.report.median_norm, norms)
        for o in rec.report.outcomes:
            if kinds[rec.senders[o.index]] == "whisper":
                assert o.reason.startswith("free rider"), o.reason
            else:
                assert not o.reason.startswith("norm"), o.reason
    selected = [rec.senders[o.index] for o in arena.records[2].report.selected()]
    assert len(selected) >= 2 and {kinds[s] for s in selected} == {"honest"}


def test_updates_without_a_gain_are_left_out_of_a_cold_rounds_references(tmp_path: Path) -> None:
    """In a round without established keys the references are the mean of the round's own admissible
    updates that gain on R, per unit of norm, more than a quarter of the round's typical update: noise
    at the honest norm, which gains little or nothing there, is left out of them (and weighs nothing
    in the median), so a flood of it cannot make every honest miner's reference noise."""
    swarm = make_swarm(newcomer_evaluations=128)
    honest = swarm.honest(3)
    probe = Arena(swarm.validator(tmp_path / "probe"), honest)
    honest_norm = probe.play().report.median_norm
    noise = [FreshNoise(swarm.setup, identity_for(f"noise/{i}"), honest_norm) for i in range(8)]
    arena = Arena(swarm.validator(tmp_path / "flooded"), [*honest, *noise])
    subs, kinds, _ = arena.submissions()
    v = arena.validator
    pipeline = RoundPipeline(v.cfg, v.weights, v.evaluator, v.batch_fn, previous=v.previous_weights)
    screened = screen(subs, v.context(pipeline), v.seen)
    secret = RoundSecret.derive(identity_for("validator"), RUN_ID, v.round)
    with pipeline:
        inspection = pipeline.inspect(screened.candidates, secret, NormReference.of(v.cfg, v.standing(), v.round))
    by_kind = {kind: [a for a in inspection.assessments if kinds[a.index] == kind] for kind in ("honest", "freshnoise")}
    assert all(a.problem is None for a in by_kind["freshnoise"])  # at the honest norm: past the gate
    assert all(a.median_weight == 0.0 for a in by_kind["freshnoise"])  # some gain a little: not enough
    assert all(a.median_weight for a in by_kind["honest"])
    assert inspection.members == {a.payload_sha256 for a in by_kind["honest"]}


def test_a_shouted_public_step_weighs_nothing_in_a_cold_rounds_median(tmp_path: Path) -> None:
    """Weighted by gain on R, a good direction sent at a large norm weighs more than an honest update;
    the public previous step is a good direction anyone has. Six fresh keys shouting it at 12x the
    honest norm, in a round without established keys, would make the median theirs and every honest
    update a free rider: a copy of the public step weighs nothing (it is rejected as one anyway)."""
    swarm = make_swarm()
    honest = swarm.honest(3)
    arena = Arena(swarm.validator(tmp_path), honest)
    for _ in range(3):
        honest_norm = arena.play().report.median_norm
    v = arena.validator
    assert v.previous_weights is not None
    shouts = [PublicSlice(swarm.setup, identity_for(f"shout/{i}"), 0, 1, (12 + i / 10) * honest_norm) for i in range(6)]
    arena.miners = [*honest, *shouts]
    subs, kinds, _ = arena.submissions()
    pipeline = RoundPipeline(v.cfg, v.weights, v.evaluator, v.batch_fn, previous=v.previous_weights)
    screened = screen(subs, v.context(pipeline), v.seen)
    secret = RoundSecret.derive(identity_for("validator"), RUN_ID, v.round)
    cold = Standing(v.standing().ratings, {})  # nobody established: the round's own payloads set the median
    with pipeline:
        decision = pipeline.decide(screened, secret, cold, run_id=RUN_ID, round_=v.round)
    by_kind = [(kinds[o.index], o) for o in decision.outcomes]
    norms = [o.norm or 0.0 for kind, o in by_kind if kind == "honest"]
    assert min(norms) <= decision.median_norm <= max(norms), (decision.median_norm, norms)
    assert all(o.reason.startswith("copy of the public") for kind, o in by_kind if kind == "publicslice")
    assert all(o.median_weight == 0.0 for kind, o in by_kind if kind == "publicslice")
    assert not any(o.reason.startswith("free rider") for kind, o in by_kind if kind == "honest")


class Shout(Uncorrected):
    """Trains on its own assignment, as an honest miner does, and sends the update at `norm`."""

    kind = "shout"

    def submit(self, view: RoundView) -> Submission | None:
        return self.send(view, self.train(view.weights, self.assignment(view.round)))


def test_one_key_shouting_a_trained_update_does_not_own_a_cold_rounds_median(tmp_path: Path) -> None:
    """A trained update sent at 24x the honest norm gains 12x more on R than at its own norm on this
    model: weighted by gain, one such key would outweigh three honest miners and make them free
    riders. Weighted per unit of norm it weighs one honest update, and three honest ones set the median."""
    quiet = make_swarm()
    probe = Arena(quiet.validator(tmp_path / "quiet"), quiet.honest(3))
    honest_norm = probe.play().report.median_norm
    swarm = make_swarm(newcomer_evaluations=128)
    shout = Shout(swarm.setup, identity_for("shout"), 24 * honest_norm)
    arena = Arena(swarm.validator(tmp_path / "shouted"), [*swarm.honest(3), shout])
    kinds = {m.key: m.kind for m in arena.miners}
    record = arena.play()
    norms = [o.norm or 0.0 for o in record.report.outcomes if kinds[record.senders[o.index]] == "honest"]
    assert min(norms) <= record.report.median_norm <= max(norms), (record.report.median_norm, norms)
    for o in record.report.outcomes:
        if kinds[record.senders[o.index]] == "shout":
            assert o.reason.startswith("norm") and "x the median" in o.reason, o.reason
        else:
            assert not o.reason.startswith("free rider"), o.reason
