"""Fresh keys in numbers: they must not own the norm gate's reference, nor pile up in the validator's book.

Three honest miners work two rounds alone and become established (their updates gained on random
data). Then twelve fresh keys each send a random update at a hundredth of the honest norm: on the
median of everyone, the honest updates would be "100x the median" and rejected, and the sybils
would pass. The reference comes from the established miners instead: the honest updates pass the
gate and are evaluated, the sybils are free riders.
"""

from __future__ import annotations

from pathlib import Path

import torch

from node.bench.arena import Arena
from node.swarm.fakeminers import FakeRun, Miner, RoundView, identity_for
from protocol.identity import Identity
from protocol.state import State
from tests.fakeswarm import make_swarm
from validator.aggregate import global_norm
from validator.intake import Submission

JUNK = 30

SYBILS = 12


class Whisper(Miner):
    """A fresh key that sends a random direction at `norm` (after its own codec's round trip)."""

    kind = "whisper"

    def __init__(self, setup: FakeRun, identity: Identity, norm: float) -> None:
        super().__init__(setup, identity)
        self.norm = norm

    def submit(self, view: RoundView) -> Submission | None:
        gen = torch.Generator().manual_seed(int(self.key[:8], 16))
        noise = {n: torch.randn(t.shape, generator=gen) for n, t in view.weights.items()}
        scale = self.norm / global_norm(self.codec.decompress(self.encode(noise, view.weights), view.weights))
        payload = self.encode({n: t * scale for n, t in noise.items()}, view.weights)
        return self.package(view.round, view.state_hash, payload)

    def encode(self, update: State, weights: State) -> bytes:
        return self.codec.compress(update, None, weights)[0]  # no error feedback: exactly this update


def test_a_sybil_majority_does_not_own_the_median_norm(tmp_path: Path) -> None:
    swarm = make_swarm(min_indicator_average=0.0)
    honest = swarm.honest(3)
    arena = Arena(swarm.validator(tmp_path), honest)
    for _ in range(2):
        record = arena.play()
        assert all(o.gains is not None and o.gains.random > 0 for o in record.report.outcomes), "honest work gains"
    honest_norm = record.report.median_norm
    sybils = [Whisper(swarm.setup, identity_for(f"whisper/{i}"), honest_norm / 100) for i in range(SYBILS)]
    arena.miners = [*honest, *sybils]
    record = arena.play()
    by_sender = {o.sender: o for o in record.report.outcomes}
    for m in honest:
        outcome = by_sender[m.key]
        assert outcome.gains is not None, f"an honest update was stopped at the norm gate: {outcome.reason}"
        assert "median" not in outcome.reason
    for s in sybils:
        outcome = by_sender[s.key]
        assert outcome.status == "rejected" and outcome.reason.startswith("free rider"), outcome.reason
    assert abs(record.report.median_norm - honest_norm) < 0.5 * honest_norm  # the honest scale, not the sybils'


class Junk(Miner):
    """A fresh key that sends random bytes (undecodable: named, ranked last)."""

    kind = "junk"

    def submit(self, view: RoundView) -> Submission | None:
        return self.package(view.round, view.state_hash, bytes(range(256)) * 4)


def test_junk_keys_do_not_pile_up_in_the_book(tmp_path: Path) -> None:
    """Keys that never sent a useful update are forgotten once they sit matches out; a key that
    did is remembered however long it stays away."""
    swarm = make_swarm(min_indicator_average=0.0)
    honest = swarm.honest(2)
    junk = [Junk(swarm.setup, identity_for(f"junk/{i}")) for i in range(JUNK)]
    arena = Arena(swarm.validator(tmp_path), [*honest, *junk])
    first = arena.play()
    assert sum("undecodable" in o.reason for o in first.report.outcomes) == JUNK
    v = arena.validator
    assert {m.key for m in junk} <= set(v.book.ratings)
    arena.miners = honest[:1]  # the second honest miner leaves after one useful round
    for _ in range(v.cfg.missing_rounds + 1):
        arena.play()
    assert not {m.key for m in junk} & set(v.book.ratings), "junk keys stay in the book"
    assert honest[1].key in v.book.ratings  # away, but it was useful: its rating waits for it
