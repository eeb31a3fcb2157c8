"""A closed round's figures: the `RoundClosed` event (logs, dashboard) and the `RoundMetrics` record (run pages).

event, text = round_closed(report, figures, intake)
metrics = round_metrics(setup, validator, report, figures)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from node.events import mb
from node.events.models import RoundClosed
from node.roles.hooks import HeldOut
from node.roles.intake import RoundIntake
from node.run.setup import RunSetup
from protocol.messages import RoundMetrics, Standing
from validator.core import RoundReport, Validator


@dataclass(frozen=True)
class Figures:
    """What the service measured around a round's decision."""

    count: int  # submissions scored
    sent: int  # their payload bytes
    dense_bytes: int  # one dense FP32 update of the model
    measured: HeldOut  # the held-out measure of the new weights
    changed: float = 0.0  # the fraction of BF16 weights the round changed
    held_out_seconds: float | None = None
    open_seconds: float | None = None


def round_metrics(setup: RunSetup, validator: Validator, report: RoundReport, figures: Figures) -> RoundMetrics:
    """The round's figures for run pages, each within its field's bounds (a diverged loss is left out)."""
    named = [s.sender for s in report.result.selected] + [r.sender for r in report.result.rejections]
    ratings, indicators = validator.ratings, validator.book.indicators
    loss, reward = figures.measured.loss, figures.measured.reward
    return RoundMetrics(
        run_id=setup.run_id,
        round=report.round,
        held_out_loss=loss if loss is not None and 0 <= loss <= 1e6 else None,
        held_out_reward=reward if reward is not None and math.isfinite(reward) else None,
        submissions=figures.count,
        received_bytes=figures.sent,
        dense_bytes=figures.dense_bytes * figures.count,
        standings=tuple(
            Standing(
                sender=key,
                rating=min(max(ratings.ordinal(key), -1e6), 1e6),
                indicator=min(max(indicators.get(key, 0.0), -1.0), 1.0),
            )
            for key in dict.fromkeys(named)
        ),
    )


def round_closed(report: RoundReport, f: Figures, intake: RoundIntake) -> tuple[RoundClosed, str]:
    """The event a closed round emits, and its log line."""
    selected = report.selected()
    ranked = sorted(report.result.selected, key=lambda s: -s.score)
    seats, measured = intake.admission, f.measured
    event = RoundClosed(
        round=report.round,
        submissions=f.count,
        selected=len(selected),
        bytes=f.sent,
        dense_bytes=f.dense_bytes * f.count,
        patch_bytes=len(report.patch),
        state_bytes=f.dense_bytes // 2,  # the BF16 weights, what a dense sync would ship
        loss=measured.loss,
        reward=measured.reward,
        changed_fraction=f.changed,
        scores={s.sender: s.score for s in ranked},
        rejections={r.sender: r.reason for r in report.result.rejections},
        state_hash=report.state_hash,
        seconds=report.seconds,
        ignored=[o.reason for o in report.outcomes if o.status == "ignored"],
        decide_seconds=report.decide_seconds,
        encode_seconds=report.encode_seconds,
        held_out_seconds=f.held_out_seconds if measured.measured else None,
        open_seconds=f.open_seconds,
        arrivals=dict(intake.arrivals),
        offered=seats.offered,
        refused=seats.refused,
        unseated=seats.unseated,
        established=len(seats.established),
    )
    held_out = f", held-out {measured.describe()}" if measured.measured else ""
    turned = f" ({seats.refused} refused, {seats.unseated} unseated)" if seats.refused or seats.unseated else ""
    smaller = f" ({f.dense_bytes * f.count / f.sent:.0f}x smaller than dense)" if f.sent else ""
    received = f"{mb(f.sent)} received{smaller}" if f.sent else "nothing received"
    text = (
        f"round {report.round} closed: {f.count} submissions{turned}, {len(selected)} aggregated, "
        f"{received}, patch {mb(len(report.patch))}, new state {report.state_hash[:12]}{held_out}"
    )
    return event, text
