"""Fake miners that try to buy standing without training, for in-process Gauntlet runs.

    publicslice  one of n disjoint slices of the public previous step W_{r-1} - W_r, at a chosen norm
                 (caught by the public-step copy check)
    whisper      a random direction at a chosen (tiny) norm (free rider; the seniors' median)
    alie         mean - z x std of this round's honest updates (own-data indicator)

The previous step is public (every node applies the patch W_{r-1} -> W_r), so a slice of it
helps random data, and n keys sending disjoint slices share no positions: no copy group finds
them. None of them trained on its own assignment.
"""

from __future__ import annotations

import torch

from node.swarm.fakeminers import FakeRun, Miner, RoundView
from protocol.identity import Identity
from protocol.state import State
from validator.aggregate import global_norm
from validator.intake import Submission


class Uncorrected(Miner):
    """A miner that sends exactly the update it builds (no error feedback), rescaled to `norm`
    after the codec's round trip when `norm` is set."""

    def __init__(self, setup: FakeRun, identity: Identity, norm: float | None = None) -> None:
        super().__init__(setup, identity)
        self.norm = norm

    def send(self, view: RoundView, update: State) -> Submission:
        if self.norm is not None:
            sent = self.codec.decompress(self.encode(update, view.weights), view.weights)
            scale = self.norm / max(global_norm(sent), 1e-30)
            update = {n: t * scale for n, t in update.items()}
        return self.package(view.round, view.state_hash, self.encode(update, view.weights))

    def encode(self, update: State, weights: State) -> bytes:
        return self.codec.compress(update, None, weights)[0]  # no error feedback: exactly this update


class PublicSlice(Uncorrected):
    """Slice `part` of `parts` of the public step: the coordinates whose flat index is `part` mod `parts`."""

    kind = "publicslice"

    def __init__(self, setup: FakeRun, identity: Identity, part: int, parts: int, norm: float | None = None) -> None:
        super().__init__(setup, identity, norm)
        self.part, self.parts = part, parts

    def submit(self, view: RoundView) -> Submission | None:
        if view.previous is None:
            return None
        before = view.previous[0]
        out = {}
        for name, now in view.weights.items():
            step = (before[name].float() - now.float()).reshape(-1)
            mask = torch.arange(step.numel()) % self.parts == self.part
            out[name] = (step * mask).reshape(now.shape)
        if global_norm(out) == 0:
            return None
        return self.send(view, out)


class Whisper(Uncorrected):
    """A random direction at `norm`."""

    kind = "whisper"

    def submit(self, view: RoundView) -> Submission | None:
        gen = torch.Generator().manual_seed(int(self.key[:8], 16) + view.round)
        return self.send(view, {n: torch.randn(t.shape, generator=gen) for n, t in view.weights.items()})


class Alie(Uncorrected):
    """mean - z x std per coordinate of the honest updates published before it this round."""

    kind = "alie"
    z = 1.0

    def submit(self, view: RoundView) -> Submission | None:
        if len(view.earlier) < 2:
            return None
        updates = [self.codec.decompress(s.read(), view.weights) for s in view.earlier]
        out = {}
        for name in view.weights:
            stack = torch.stack([u[name].float() for u in updates])
            out[name] = stack.mean(0) - self.z * stack.std(0, unbiased=False)
        return self.send(view, out)
