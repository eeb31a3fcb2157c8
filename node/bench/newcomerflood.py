"""The validator under a flood of valid noise from fresh keys (`pulse bench gauntlet --flood N`).

Honest miners play until every one of them is established; then, for `FLOOD_ROUNDS` rounds, N
fresh keys beside them send random updates at the published median norm (`FreshNoise`: no
training, a payload costs its key one compression). Such payloads pass every check before
evaluation. Measured: the validator's seconds per round in the last round before the flood and in
the flooded ones, the honest miners aggregated in each, the flood's keys aggregated (never, if
the Gauntlet holds), and how many newcomer payloads a flooded round left unexamined
(`GauntletConfig.newcomer_evaluations` bounds the ones it examines).

Two variants: `norm_share` sends the noise at that multiple of the honest norm (0.01: a whisper
that, as the majority of a round's norms, would set the norm gate's median), and `cold` starts the
flood with the run, before anyone is established, for `COLD_ROUNDS` rounds (its norm then taken
from one honest update of round 0, made by a miner outside the run). The keys are the same every
round, so a lucky record can build up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from node.bench.arena import Arena, RoundRecord
from node.swarm.fakeminers import FakeRun, FreshNoise, Miner, RoundView, identity_for
from validator.aggregate import global_norm
from validator.core import Validator
from validator.newcomers import NOT_EXAMINED

FLOOD_ROUNDS = 2
COLD_ROUNDS = 8
MAX_WARMUP_ROUNDS = 12


@dataclass(frozen=True)
class FloodOutcome:
    keys: int
    norm_share: float  # the noise's norm, as a multiple of the honest one
    cold: bool  # the flood started with the run
    warmup_rounds: int  # rounds the honest miners took to be established (0 when cold)
    quiet_seconds: float | None  # the validator's round just before the flood (None when cold)
    quiet_honest: int | None  # honest miners aggregated in it
    seconds: list[float]  # each flooded round's
    honest: list[int]  # honest miners aggregated in each flooded round
    flood: list[int]  # the flood's keys aggregated in each
    unexamined: list[int]  # newcomer payloads rejected unexamined in each

    def summary(self) -> dict[str, object]:
        return {
            "flood_keys": self.keys,
            "flood_norm_share": self.norm_share,
            "flood_cold": self.cold,
            "flood_warmup_rounds": self.warmup_rounds,
            "flood_quiet_validator_seconds": self.quiet_seconds,
            "flood_validator_seconds_per_round": sum(self.seconds) / len(self.seconds),
            "flood_quiet_honest_aggregated": self.quiet_honest,
            "flood_honest_aggregated": self.honest,
            "flood_keys_aggregated": self.flood,
            "flood_unexamined": self.unexamined,
        }


def establish(arena: Arena, keys: set[str], max_rounds: int = MAX_WARMUP_ROUNDS) -> None:
    """Play `arena` until every one of `keys` is established; RuntimeError after `max_rounds` rounds."""
    while not keys <= arena.validator.established():
        if len(arena.records) >= max_rounds:
            raise RuntimeError(f"the honest miners were not all established after {max_rounds} rounds")
        arena.play()


def honest_norm(validator: Validator, setup: FakeRun) -> float:
    """The decoded norm of one honest update of the validator's current round, by a miner outside it."""
    probe = Miner(setup, identity_for("flood/probe"))
    sub = probe.submit(RoundView(validator.round, validator.weights, validator.state_hash, None))
    assert sub is not None
    return global_norm(probe.codec.decompress(sub.read(), validator.weights))


def measure(
    validator: Validator,
    honest: Sequence[Miner],
    setup: FakeRun,
    keys: int,
    seed: int = 0,
    *,
    norm_share: float = 1.0,
    cold: bool = False,
) -> FloodOutcome:
    arena = Arena(validator, list(honest), seed=seed)
    ours = {m.key for m in honest}
    quiet: RoundRecord | None = None
    if cold:
        norm = honest_norm(validator, setup)
    else:
        establish(arena, ours)
        quiet = arena.records[-1]
        norm = quiet.report.median_norm
    noise = [FreshNoise(setup, identity_for(f"flood/{seed}/{i}"), norm * norm_share) for i in range(keys)]
    arena.miners = [*honest, *noise]
    warmup = len(arena.records)
    flooded = [arena.play() for _ in range(COLD_ROUNDS if cold else FLOOD_ROUNDS)]
    theirs = {m.key for m in noise}

    def aggregated(record: RoundRecord, who: set[str]) -> int:
        return sum(1 for o in record.report.selected() if o.sender in who)

    return FloodOutcome(
        keys=keys,
        norm_share=norm_share,
        cold=cold,
        warmup_rounds=warmup,
        quiet_seconds=None if quiet is None else quiet.report.seconds,
        quiet_honest=None if quiet is None else aggregated(quiet, ours),
        seconds=[r.report.seconds for r in flooded],
        honest=[aggregated(r, ours) for r in flooded],
        flood=[aggregated(r, theirs) for r in flooded],
        unexamined=[sum(1 for o in r.report.outcomes if o.reason.startswith(NOT_EXAMINED)) for r in flooded],
    )
