"""An update that does not gain on the validator's random batches, or gains there no more than a
quarter of its reference, is measured on them alone: two forward passes instead of sixteen once its
reference's gain is known, and the round's decision is the one a complete measurement gives."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from node.bench.arena import Arena
from node.swarm.fakeminers import FreshNoise, identity_for
from protocol.state import State
from tests.fakeswarm import CountingEvaluator, make_swarm
from validator.scoring import Gains, RoundEvaluation

RANDOM, ASSIGNED = (0.0, 0.5), (1.0, 1.5, 2.0, 2.5)


class Parabola:
    """loss(b) = 1 + (w - b)^2 for the loaded weight w: an update moving w towards a batch gains on it."""

    def __init__(self) -> None:
        self.w, self.losses, self.loads = 0.0, 0, 0

    def load(self, base: State, update: State | None = None, step: float = 0.0) -> None:
        self.loads += 1
        self.w = float(base["w"]) - (step * float(update["w"]) if update is not None else 0.0)

    def loss(self, batch: float) -> float:
        self.losses += 1
        return 1.0 + (self.w - batch) ** 2


def _round(evaluator: Parabola, candidates: int = 1, useful_share: float = 0.0) -> RoundEvaluation:
    assigned = {i: list(ASSIGNED) for i in range(candidates)}
    return RoundEvaluation(evaluator, {"w": torch.tensor(1.0)}, 0.1, list(RANDOM), assigned, useful_share)


def test_an_update_that_loses_on_random_data_costs_its_random_batches_alone() -> None:
    evaluator = Parabola()
    ev = _round(evaluator)
    before = evaluator.losses
    away = {"w": torch.tensor(-1.0)}  # w moves from 1 to 1.1: further from both random batches
    reference = {"w": torch.tensor(1.0)}
    gains = ev.gains(0, away, 1.0, reference)
    assert evaluator.losses - before == len(RANDOM)
    assert gains.random < 0 and not gains.measured and gains.indicator(0.0, 0.25) == -1
    complete = _round(Parabola()).gains(0, away, 1.0, reference, complete=True)
    assert complete.measured and complete.random == gains.random
    assert complete.indicator(0.0, 0.25) == -1  # what the skipped measurements could not have changed


def test_an_update_that_gains_is_measured_exactly_as_completely() -> None:
    evaluator = Parabola()
    ev = _round(evaluator)
    before = evaluator.losses
    towards = {"w": torch.tensor(4.0)}  # w moves from 1 to 0.6: nearer the random batches
    reference = {"w": torch.tensor(2.0)}
    gains = ev.gains(0, towards, 1.0, reference)
    # its A and R, the reference's A and R, and its A at W the first time it is needed
    assert evaluator.losses - before == 3 * len(ASSIGNED) + 2 * len(RANDOM)
    assert gains.measured and gains == _round(Parabola()).gains(0, towards, 1.0, reference, complete=True)
    again = evaluator.losses
    ev.gains(0, towards, 1.0, None)
    assert evaluator.losses - again == len(ASSIGNED) + len(RANDOM)  # the losses at W are kept
    assert Gains(float("nan"), 0.01, float("nan"), float("nan")).indicator(0.0, 0.0) == -1


def test_a_gain_on_random_data_measured_for_the_norm_gate_is_not_measured_again() -> None:
    """The norm gate of a round without established keys measures each payload's gain on R at its own
    norm (`random_gain`); its evaluation at the same scale reuses it, and is otherwise unchanged. At
    another scale, or without a key, R is measured again."""
    evaluator = Parabola()
    ev = RoundEvaluation(evaluator, {"w": torch.tensor(1.0)}, 0.1, list(RANDOM), {})
    towards, reference = {"w": torch.tensor(4.0)}, {"w": torch.tensor(2.0)}
    before = evaluator.losses
    gain = ev.random_gain(towards, key="p")
    assert evaluator.losses - before == len(RANDOM) and gain > 0
    ev.assign({0: list(ASSIGNED)})
    before = evaluator.losses
    gains = ev.gains(0, towards, 1.0, reference, update_key="p")
    assert evaluator.losses - before == 3 * len(ASSIGNED) + len(RANDOM)  # its R is kept
    assert gains == _round(Parabola()).gains(0, towards, 1.0, reference, complete=True)
    before = evaluator.losses
    assert ev.random_gain(towards, 0.5, key="p") != gain and ev.random_gain(towards) == gain
    assert evaluator.losses - before == 2 * len(RANDOM)
    away = {"w": torch.tensor(-1.0)}
    assert ev.random_gain(away, key="q") < 0
    before = evaluator.losses
    assert not ev.gains(0, away, 1.0, reference, update_key="q").measured
    assert evaluator.losses == before  # kept, and no gain: nothing more is measured


def test_an_update_that_gains_less_than_a_quarter_of_its_reference_is_not_measured_on_its_data() -> None:
    """Its reference's gain on R is measured once per distinct reference: the first such update costs
    its R and A and the reference's R; the next with the same reference, its R alone."""
    evaluator = Parabola()
    ev = _round(evaluator, candidates=3, useful_share=0.25)
    reference = {"w": torch.tensor(4.0)}  # w to 0.6: gains about 0.27 on R
    little = {"w": torch.tensor(0.1)}  # w to 0.99: gains about 0.009 on R, under a quarter of 0.27
    before = evaluator.losses
    first = ev.gains(0, little, 1.0, reference, reference_key="newcomers")
    assert evaluator.losses - before == 2 * len(RANDOM) + len(ASSIGNED)
    assert 0 < first.random < 0.25 * first.random_ref and not first.measured and first.indicator(0.0, 0.25) == -1
    complete = _round(Parabola(), useful_share=0.25).gains(0, little, 1.0, reference, complete=True)
    assert complete.measured and (complete.random, complete.random_ref) == (first.random, first.random_ref)
    assert complete.indicator(0.0, 0.25) == -1  # what the skipped measurements could not have changed
    before = evaluator.losses
    second = ev.gains(1, little, 1.0, reference, reference_key="newcomers")
    assert evaluator.losses - before == len(RANDOM) and second == first
    # a useful update with a known reference: its A, the reference's A and A at W, but not the reference's R
    towards = {"w": torch.tensor(3.0)}
    before = evaluator.losses
    gains = ev.gains(2, towards, 1.0, reference, reference_key="newcomers")
    assert evaluator.losses - before == len(RANDOM) + 3 * len(ASSIGNED)
    assert gains == _round(Parabola(), useful_share=0.25).gains(0, towards, 1.0, reference, complete=True)


@pytest.mark.parametrize("kinds", [("quietnoise", "thief")])
def test_a_round_decides_the_same_with_the_skipped_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kinds: tuple[str, ...]
) -> None:
    """The same round, from two copies of a validator's folder: once as the validator runs it, once
    with every update measured completely. Every outcome (status, reason, indicator, final score,
    the standing it leaves) is the same, and the updates that lost on random data, or gained there too
    little, cost fewer passes."""
    swarm = make_swarm()
    honest = swarm.honest(3)
    arena = Arena(swarm.validator(tmp_path / "v"), [*honest, *swarm.adversaries(kinds, [m.key for m in honest])])
    for _ in range(3):
        norm = arena.play().report.median_norm
    # fresh keys of noise at the median norm: some lose on R, some gain a little there
    arena.miners = [*arena.miners, *(FreshNoise(swarm.setup, identity_for(f"cost/{i}"), norm) for i in range(6))]
    subs, _, _ = arena.submissions()
    shutil.copytree(tmp_path / "v", tmp_path / "twin")

    skipping = CountingEvaluator(arena.validator.evaluator)
    arena.validator.evaluator = skipping
    report = arena.validator.run_round(subs)

    complete = swarm.reopen(tmp_path / "twin")
    counting = CountingEvaluator(complete.evaluator)
    complete.evaluator = counting
    measure = RoundEvaluation.gains
    monkeypatch.setattr(RoundEvaluation, "gains", lambda self, *a, **k: measure(self, *a, **{**k, "complete": True}))
    twin = complete.run_round(subs)

    def decided(r: object) -> list[tuple[object, ...]]:
        return [(o.sender, o.status, o.reason, o.indicator, o.final, o.score) for o in r.outcomes]  # type: ignore[attr-defined]

    assert decided(report) == decided(twin)
    assert report.state_hash == twin.state_hash
    lost = [o for o in report.outcomes if o.gains is not None and not o.gains.measured]
    assert any(o.gains.random <= 0 for o in lost), "no update lost on random data: the test proves nothing"
    assert any(o.gains.random > 0 for o in lost), "no update gained a little on R: the test proves nothing"
    assert all(o.gains is not None and o.gains.measured for o in twin.outcomes if o.gains is not None)
    assert skipping.losses < counting.losses
