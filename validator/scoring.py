"""Scoring: loss before and after a small evaluation step, relative gains, the indicator, copies.

For a submission with (clipped) update g, the validator evaluates W - eta*g on the miner's
assigned batch A and on its own random batches R (`eta` = evaluation step):

    gain(B, g)  = (L(B, W) - L(B, W - eta*g)) / L(B, W)        relative improvement
    score       = gain(R, g)

The indicator asks whether the miner trained on its own data. A batch can be easy or hard to
improve whoever trained, so the own-data advantage is measured against the round's reference
update ref (the mean direction of the round's admissible updates, at the median norm):

    margin    = (gain(A, g) - gain(A, ref)) - (gain(R, g) - gain(R, ref))
    indicator = +1 if margin > indicator_margin * |gain(R, ref)| else -1

An update trained on A helps A more than the typical update does; one trained elsewhere helps
A no more than R. On the embedded GPT this difference-in-differences separates the two far
better than comparing gain(A, g) with gain(R, g) alone (`pulse bench gauntlet`).

Copies: a `Sketch` keeps an update's nonzero values at every stride-th coordinate (offset chosen
per round by the validator), a few kilobytes, so a round compares all pairs without holding
any decoded update.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from protocol.identity import Identity, verify_signature
from protocol.state import State

Batch = Any  # opaque to the validator: whatever the node's batch function returns
BatchFn = Callable[[int], Batch]  # batch seed -> batch of the run's training split


class Evaluator(Protocol):
    """The model, as the validator sees it. The node wires in its GPT (`node/learn/gpteval.py`)."""

    def load(self, base: State, update: State | None = None, step: float = 0.0) -> None:
        """Set the weights to base - step * update, in FP32 (base alone when update is None)."""

    def loss(self, batch: Batch) -> float:
        """Mean loss of the loaded weights on `batch`, without gradients."""


# -- the validator's private randomness ------------------------------------------------------


@dataclass(frozen=True)
class RoundSecret:
    """Per-round randomness only this validator can compute (a hash of its own signature), yet
    the same after a restart: random batches, which assigned batch to test, the sketch offset.

    Ed25519 signatures are deterministic, so the validator cannot choose its secret; once the
    round is closed it reveals the signature (the round's evidence), and anyone can check it
    against the validator's key (`revealed`) and redraw the round's batches (a miner's receipt).
    """

    digest: bytes
    signature: bytes = b""  # what `digest` hashes

    @classmethod
    def derive(cls, identity: Identity, run_id: str, round_: int) -> RoundSecret:
        signature = identity.sign(_secret_preimage(run_id, round_))
        return cls(hashlib.sha256(signature).digest(), signature)

    @classmethod
    def revealed(cls, signature: bytes, signer: bytes, run_id: str, round_: int) -> RoundSecret:
        """The secret of a closed round from its revealed signature; `InvalidSignature` unless `signer` made it."""
        verify_signature(signer, _secret_preimage(run_id, round_), signature)
        return cls(hashlib.sha256(signature).digest(), signature)

    def number(self, *parts: object) -> int:
        """A 63-bit number named by `parts`."""
        h = hashlib.sha256(self.digest + "/".join(map(str, parts)).encode())
        return int.from_bytes(h.digest()[:8], "big") >> 1

    def random_seeds(self, count: int) -> list[int]:
        return [self.number("random-batch", i) for i in range(count)]

    def assigned_index(self, miner: str, batches: int) -> int:
        return self.number("assigned", miner) % batches

    def sketch_offset(self, stride: int) -> int:
        return self.number("sketch") % stride


def _secret_preimage(run_id: str, round_: int) -> bytes:
    return b"pulse/gauntlet-secret\x00" + bytes.fromhex(run_id) + struct.pack(">Q", round_)


# -- gains and the indicator -----------------------------------------------------------------


def relative_gain(before: float, after: float) -> float:
    """(before - after) / before; 0 when before is not a positive finite loss."""
    if not (math.isfinite(before) and before > 0):
        return 0.0
    gain = (before - after) / before
    return gain if math.isfinite(gain) else -math.inf


@dataclass(frozen=True)
class Gains:
    """Relative gains of a submission's update (g) and of the round's reference update (ref)."""

    assigned: float  # gain(A, g)
    random: float  # gain(R, g): the score
    assigned_ref: float  # gain(A, ref)
    random_ref: float  # gain(R, ref)

    @property
    def margin(self) -> float:
        return (self.assigned - self.assigned_ref) - (self.random - self.random_ref)

    def indicator(self, margin_fraction: float) -> int:
        return 1 if self.margin > margin_fraction * abs(self.random_ref) else -1


def moving_average(average: float, indicator: int, decay: float) -> float:
    return decay * average + (1.0 - decay) * indicator


class RoundEvaluation:
    """Loss measurements of one round, sharing what every submission needs.

    Losses at W and at W - eta*ref are measured once for R and for every assigned batch; each
    submission then costs one weight load and the forward passes on its A and on R.
    """

    def __init__(
        self,
        evaluator: Evaluator,
        weights: State,
        step: float,
        random: Sequence[Batch],
        assigned: Mapping[int, Batch],  # candidate index -> its assigned batch A
        reference: State | None,
    ) -> None:
        self.evaluator, self.weights, self.step = evaluator, weights, step
        self.random, self.assigned = list(random), dict(assigned)
        evaluator.load(weights)
        self.before_r = self._loss_r()
        self.before_a = {i: evaluator.loss(b) for i, b in self.assigned.items()}
        if reference is None:
            self.ref_r, self.ref_a = 0.0, dict.fromkeys(self.assigned, 0.0)
        else:
            evaluator.load(weights, reference, step)
            self.ref_r = relative_gain(self.before_r, self._loss_r())
            self.ref_a = {i: relative_gain(self.before_a[i], evaluator.loss(b)) for i, b in self.assigned.items()}

    def gains(self, index: int, update: State, scale: float) -> Gains:
        """Gains of `update` * `scale` for candidate `index` (its A was given at construction)."""
        self.evaluator.load(self.weights, update, self.step * scale)
        after_a = self.evaluator.loss(self.assigned[index])
        after_r = self._loss_r()
        return Gains(
            assigned=relative_gain(self.before_a[index], after_a),
            random=relative_gain(self.before_r, after_r),
            assigned_ref=self.ref_a[index],
            random_ref=self.ref_r,
        )

    def _loss_r(self) -> float:
        return sum(self.evaluator.loss(b) for b in self.random) / len(self.random)


# -- copies ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sketch:
    """An update's nonzero values at sampled coordinates: (positions ascending, values)."""

    positions: np.ndarray  # int64 sample ids
    values: np.ndarray  # float64

    @classmethod
    def of(cls, update: State, stride: int, offset: int) -> Sketch:
        positions, values, base = [], [], 0
        for name in sorted(update):
            sample = update[name].reshape(-1)[offset::stride].double().numpy()
            nz = np.flatnonzero(sample)
            positions.append(nz + base)
            values.append(sample[nz])
            base += len(sample)
        return cls(np.concatenate(positions), np.concatenate(values))

    def overlap(self, other: Sketch) -> float:
        """Shared nonzero positions over the smaller update's count (0 when either is empty)."""
        smaller = min(len(self.positions), len(other.positions))
        if smaller == 0:
            return 0.0
        return len(np.intersect1d(self.positions, other.positions, assume_unique=True)) / smaller

    def cosine(self, other: Sketch) -> float:
        _, mine, theirs = np.intersect1d(self.positions, other.positions, assume_unique=True, return_indices=True)
        norms = float(np.linalg.norm(self.values)) * float(np.linalg.norm(other.values))
        return float(self.values[mine] @ other.values[theirs]) / norms if norms > 0 else 0.0


@dataclass(frozen=True)
class CopyCandidate:
    index: int  # arrival order
    payload_sha256: str
    sketch: Sketch
    margin: float
    indicator: int


def copy_owners(items: Sequence[CopyCandidate], overlap: float, cosine: float) -> dict[int, int]:
    """index -> index of the submission it copies, for every copy among `items`.

    Submissions with the same payload hash, or whose sketches overlap by at least `overlap` with
    cosine at least `cosine`, form a group. Its owner is, among the members whose indicator is +1
    this round (the update helps their own data), the one with the largest margin; if there is
    none, the earliest. The rest are copies. Templar penalizes the later uploader; asking the
    data first means a thief that trains on its victim's assignment and uploads first does not
    turn its victim into the copy.
    """
    parent = list(range(len(items)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for j, later in enumerate(items):
        for i in range(j):
            earlier = items[i]
            same = earlier.payload_sha256 == later.payload_sha256
            if same or (
                earlier.sketch.overlap(later.sketch) >= overlap and earlier.sketch.cosine(later.sketch) >= cosine
            ):
                parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(items)):
        groups.setdefault(root(i), []).append(i)
    owners: dict[int, int] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        trained = [i for i in members if items[i].indicator > 0]
        owner = max(trained, key=lambda i: (items[i].margin, -i)) if trained else members[0]
        for i in members:
            if i != owner:
                owners[items[i].index] = items[owner].index
    return owners
