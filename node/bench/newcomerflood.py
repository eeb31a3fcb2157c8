"""The validator under a flood of valid noise from fresh keys (`pulse bench gauntlet --flood N`).

Honest miners play until every one of them is established; then, for `FLOOD_ROUNDS` rounds, N
fresh keys beside them send random updates at the published median norm (`FreshNoise`: no
training, a payload costs its key one compression). Such payloads pass every check before
evaluation. Measured: the validator's seconds per round in the last round before the flood and in
the flooded ones, the honest miners aggregated in each, and how many newcomer payloads a flooded
round left unexamined (`GauntletConfig.newcomer_evaluations` bounds the ones it examines).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from node.bench.arena import Arena, RoundRecord
from node.swarm.fakeminers import FakeRun, FreshNoise, Miner, identity_for
from validator.core import Validator
from validator.newcomers import NOT_EXAMINED

FLOOD_ROUNDS = 2
MAX_WARMUP_ROUNDS = 12


@dataclass(frozen=True)
class FloodOutcome:
    keys: int
    warmup_rounds: int  # rounds the honest miners took to be established
    quiet_seconds: float  # the validator's round just before the flood
    quiet_honest: int  # honest miners aggregated in it
    seconds: list[float]  # each flooded round's
    honest: list[int]  # honest miners aggregated in each flooded round
    unexamined: list[int]  # newcomer payloads rejected unexamined in each

    def summary(self) -> dict[str, object]:
        return {
            "flood_keys": self.keys,
            "flood_warmup_rounds": self.warmup_rounds,
            "flood_quiet_validator_seconds": self.quiet_seconds,
            "flood_validator_seconds_per_round": sum(self.seconds) / len(self.seconds),
            "flood_quiet_honest_aggregated": self.quiet_honest,
            "flood_honest_aggregated": self.honest,
            "flood_unexamined": self.unexamined,
        }


def establish(arena: Arena, keys: set[str], max_rounds: int = MAX_WARMUP_ROUNDS) -> None:
    """Play `arena` until every one of `keys` is established; RuntimeError after `max_rounds` rounds."""
    while not keys <= arena.validator.established():
        if len(arena.records) >= max_rounds:
            raise RuntimeError(f"the honest miners were not all established after {max_rounds} rounds")
        arena.play()


def measure(validator: Validator, honest: Sequence[Miner], setup: FakeRun, keys: int, seed: int = 0) -> FloodOutcome:
    arena = Arena(validator, list(honest), seed=seed)
    ours = {m.key for m in honest}
    establish(arena, ours)
    quiet = arena.records[-1]
    norm = quiet.report.median_norm
    arena.miners = [*honest, *(FreshNoise(setup, identity_for(f"flood/{seed}/{i}"), norm) for i in range(keys))]
    flooded = [arena.play() for _ in range(FLOOD_ROUNDS)]

    def aggregated(record: RoundRecord) -> int:
        return sum(1 for o in record.report.selected() if o.sender in ours)

    return FloodOutcome(
        keys=keys,
        warmup_rounds=len(arena.records) - FLOOD_ROUNDS,
        quiet_seconds=quiet.report.seconds,
        quiet_honest=aggregated(quiet),
        seconds=[r.report.seconds for r in flooded],
        honest=[aggregated(r) for r in flooded],
        unexamined=[sum(1 for o in r.report.outcomes if o.reason.startswith(NOT_EXAMINED)) for r in flooded],
    )
