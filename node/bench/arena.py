"""An in-process run: fake miners submit, a `Validator` judges, everyone moves to the new state.

Each round every miner builds its submission from the round's BF16 weights, in three waves:
honest miners, then attacks that need nothing of others, in a seeded shuffled order together;
then attacks that reuse what others published (copycat, replay), which therefore arrive last.
A thief needs only its victim's public key, so it may arrive before its victim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from node.swarm.fakeminers import Miner, RoundView, arrival_order
from validator.core import RoundReport, Validator
from validator.intake import Submission

LATE_KINDS = ("copycat", "replay", "alie")  # alie is built from the honest updates of the round


@dataclass(frozen=True)
class RoundRecord:
    report: RoundReport
    kinds: list[str]  # kind of the miner behind each submission, in arrival order
    senders: list[str]  # public key of that miner
    weights: dict[str, torch.Tensor]  # BF16 W_{r+1}

    def selected_kinds(self) -> list[str]:
        return [self.kinds[o.index] for o in self.report.selected()]


@dataclass
class Arena:
    validator: Validator
    miners: Sequence[Miner]
    seed: int = 0
    records: list[RoundRecord] = field(default_factory=list)
    _previous: tuple[dict[str, torch.Tensor], str] | None = None
    _last_honest: list[Submission] = field(default_factory=list)

    def submissions(self) -> tuple[list[Submission], list[str], list[str]]:
        """This round's submissions in arrival order, with their miners' kinds and keys."""
        v = self.validator
        view = RoundView(v.round, v.weights, v.state_hash, self._previous, last_round=self._last_honest)
        r = v.round
        made = [(m, m.submit(view)) for m in self.miners if m.role(r) not in LATE_KINDS]
        view.earlier = [s for m, s in made if s is not None and m.role(r) == "honest"]
        self._last_honest = list(view.earlier)
        order = arrival_order([(m, s) for m, s in made if s is not None], self.seed + r)
        order += [(m, s) for m in self.miners if m.role(r) in LATE_KINDS if (s := m.submit(view)) is not None]
        return [s for _, s in order], [m.role(r) for m, _ in order], [m.key for m, _ in order]

    def play(self) -> RoundRecord:
        subs, kinds, senders = self.submissions()
        before = (self.validator.weights, self.validator.state_hash)
        report = self.validator.run_round(subs)
        self._previous = before
        record = RoundRecord(report, kinds, senders, self.validator.weights)
        self.records.append(record)
        return record
