"""A lying validator: a test double of the validator that signs results its inputs do not give.

    cls = lying_validator("add", from_round=3)     # a `Validator` subclass: honest before round 3
    v = cls.create(...)                            # or `cls.open(...)`, like the real one

Each lie keeps the result looking right to anyone who only checks hashes: the result, its evidence
and its FP32 state hashes describe what the liar did (so followers apply its patch and land on the
state it names), except where said. Only recomputing the round from its public inputs tells:

| lie     | the liar                                                            | an auditor finds          |
|---------|---------------------------------------------------------------------|---------------------------|
| add     | adds an update of its own to the aggregate                          | the FP32 and BF16 states  |
| drop    | leaves the last selected submission out of the aggregate, lists it  | the FP32 and BF16 states  |
| scale   | applies the outer step at 1.5x the run's learning rate, claims 1x   | the FP32 and BF16 states  |
| patch   | publishes a patch to another state than the one its result names    | the patch                 |
| median  | commits a norm-gate median 1.5x the one its gate used               | the median                |

`python -m pulse_redteam.faults --lie KIND ...` runs a `pulse validator` process with one of these
(`faults.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from protocol import pulsesync
from protocol.state import State, StateDict
from validator.aggregate import Aggregate, global_norm
from validator.core import Validator
from validator.gauntlet import Assessment, Decision, RoundPipeline, Standing
from validator.intake import Screened
from validator.scoring import RoundSecret

LIES = ("add", "drop", "scale", "patch", "median")
SCALE = 1.5


def told(lie: str, submissions: int, selected: int) -> bool:
    """Whether `lie` changes anything in a round with these counts: "drop" and "scale" need an
    aggregated update, "median" a measured submission; "add" and "patch" lie in any round."""
    if lie in ("drop", "scale"):
        return selected > 0
    if lie == "median":
        return submissions > 0
    return True


def lying_validator(lie: str, from_round: int = 0) -> type[Validator]:
    """A `Validator` class that tells `lie` in every round from `from_round` on (honest before)."""
    if lie not in LIES:
        raise ValueError(f"unknown lie {lie!r}: one of {LIES}")
    return type(f"Lying{lie.title()}Validator", (LyingValidator,), {"lie": lie, "from_round": from_round})


class LyingValidator(Validator):
    lie = "add"
    from_round = 0

    @property
    def lying(self) -> bool:
        return self.round >= self.from_round

    def _pipeline(self, spill: Path | None = None) -> RoundPipeline:
        if self.lying and self.lie == "drop":
            return DroppingPipeline(self.cfg, self.weights, self.evaluator, self.batch_fn, spill)
        if self.lying and self.lie == "median":
            return MedianPipeline(self.cfg, self.weights, self.evaluator, self.batch_fn, spill)
        return super()._pipeline(spill)

    def _step(self, update: StateDict | None) -> tuple[StateDict, str]:
        if self.lying and self.lie == "add":
            update = _plus_own(update, self.outer.master, self.round)
        elif self.lying and self.lie == "scale" and update is not None:
            update = {name: t * SCALE for name, t in update.items()}
        return super()._step(update)

    def _encode(self, new_weights: State, new_hash: str) -> bytes:
        if not (self.lying and self.lie == "patch"):
            return super()._encode(new_weights, new_hash)
        other = {name: t.clone() for name, t in new_weights.items()}
        first = sorted(other)[0]
        other[first].view(-1)[0] += 1.0  # one weight off: a different state, under the named hash
        return pulsesync.encode(self.weights, other, old_hash=self.state_hash, new_hash=new_hash)


class DroppingPipeline(RoundPipeline):
    """Aggregates all but the last selected submission, and reports the honest aggregate's norms and clips."""

    def aggregate(self, selected: Sequence[Assessment]) -> Aggregate | None:
        honest = super().aggregate(selected)
        if honest is None:
            return None
        partial = super().aggregate(selected[:-1])
        update = partial.update if partial is not None else {n: torch.zeros_like(t) for n, t in honest.update.items()}
        return dataclasses.replace(honest, update=update)


class MedianPipeline(RoundPipeline):
    """Gates honestly, but commits another median norm than the one its gate used (e.g. to make an
    honest update look over the gate, or a dropped one look like a free rider)."""

    def decide(
        self, screened: Screened, secret: RoundSecret, standing: Standing, *, run_id: str, round_: int
    ) -> Decision:
        honest = super().decide(screened, secret, standing, run_id=run_id, round_=round_)
        return dataclasses.replace(honest, median_norm=honest.median_norm * SCALE)


def _plus_own(update: StateDict | None, master: State, round_: int) -> StateDict:
    """`update` plus a direction of the liar's own, half the update's norm (a small nudge, not noise)."""
    seed = int.from_bytes(hashlib.sha256(f"pulse-lie/{round_}".encode()).digest()[:8], "big")
    gen = torch.Generator().manual_seed(seed)
    own = {name: torch.randn(t.shape, generator=gen) for name, t in sorted(master.items())}
    norm = global_norm(update) if update is not None else 1e-3
    scale = 0.5 * norm / max(global_norm(own), 1e-30)
    if not math.isfinite(scale):
        scale = 0.0
    if update is None:
        return {name: t * scale for name, t in own.items()}
    return {name: update[name] + own[name] * scale for name in update}
