"""Persistent miner ratings: OpenSkill Plackett-Luce, one match per round.

Each round is one match. Miners whose submission was evaluated are ranked by score (best
first, equal scores tie); everyone else in the match ties for last: invalid or penalized
submissions, and rated miners that were active within `missing_rounds` but sent nothing.
A miner that stays away longer sits matches out with its rating frozen, so leaving and
returning neither resets nor erodes it (gossipsub keeps scores after a disconnect for the same
reason). The Gauntlet forgets only keys that never sent a useful update (`gauntlet.rate`): a fresh
key costs nothing, so keeping their ratings would protect nothing and let junk keys fill the book.
Ratings are plain numbers, so they serialize to JSON exactly (floats round-trip).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from openskill.models import PlackettLuce
from pydantic import BaseModel, ConfigDict, Field


class RatingRecord(BaseModel):
    """One miner's rating as stored on disk."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    mu: float = Field(allow_inf_nan=False)
    sigma: float = Field(gt=0, allow_inf_nan=False)
    last_round: int = Field(ge=0)
    """The last round the miner submitted a signed, current submission."""


@dataclass(frozen=True)
class Ratings:
    """An immutable table of ratings; `rate` returns the next one."""

    beta: float
    tau: float
    missing_rounds: int  # a silent miner ranks last for this many rounds, then sits matches out
    records: Mapping[str, RatingRecord]

    def _model(self) -> PlackettLuce:
        return PlackettLuce(beta=self.beta, tau=self.tau)

    def ordinal(self, miner: str) -> float:
        """mu - 3 sigma: a rating the miner holds with ~99.7% confidence (0 for a newcomer)."""
        record = self.records.get(miner)
        if record is None:
            return self._model().rating().ordinal()
        return record.mu - 3 * record.sigma

    def strength(self, miner: str) -> float:
        """exp(ordinal / beta): the conservative rating as a Plackett-Luce strength, positive and in the
        ordinal's order (1 for a newcomer). Selection multiplies it into the final score; the ordinal
        itself turns negative for whoever loses its first matches and would flip that score's sign.
        """
        return math.exp(max(self.ordinal(miner), -1e6) / self.beta)

    def rate(self, round_: int, ranked: Sequence[tuple[str, float]], last: Sequence[str]) -> Ratings:
        """The ratings after this round's match.

        `ranked`: (miner, score) of evaluated submissions; `last`: miners that submitted
        something unusable. Recently active miners missing from both also rank last.
        """
        submitted = [m for m, _ in ranked] + list(last)
        if len(set(submitted)) != len(submitted):
            raise ValueError("a miner appears twice in one match")
        here = set(submitted)
        missing = [
            m for m, r in sorted(self.records.items()) if m not in here and round_ - r.last_round <= self.missing_rounds
        ]
        players = submitted + missing
        records = dict(self.records)
        for m in submitted:
            old = records.get(m)
            mu, sigma = (old.mu, old.sigma) if old else (self._model().mu, self._model().sigma)
            records[m] = RatingRecord(mu=mu, sigma=sigma, last_round=round_)
        if len(players) < 2:
            return self._with(records)
        model = self._model()
        teams = [[model.rating(mu=records[m].mu, sigma=records[m].sigma, name=m)] for m in players]
        ranks = _ranks([s for _, s in ranked]) + [float(len(ranked))] * (len(last) + len(missing))
        rated = model.rate(teams, ranks=ranks)
        for m, team in zip(players, rated, strict=True):
            records[m] = RatingRecord(mu=team[0].mu, sigma=team[0].sigma, last_round=records[m].last_round)
        return self._with(records)

    def without(self, miners: Iterable[str]) -> Ratings:
        """The table without `miners` (a forgotten miner rates as a newcomer again)."""
        gone = set(miners)
        return self._with({m: r for m, r in self.records.items() if m not in gone})

    def _with(self, records: Mapping[str, RatingRecord]) -> Ratings:
        return Ratings(self.beta, self.tau, self.missing_rounds, records)


def _ranks(scores: Sequence[float]) -> list[float]:
    """Rank 0 for the best score; equal scores share a rank."""
    order = sorted(set(scores), reverse=True)
    position = {s: float(i) for i, s in enumerate(order)}
    return [position[s] for s in scores]
