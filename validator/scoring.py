"""Scoring: loss before and after a small evaluation step, relative gains, the indicator, copies.

For a submission with (clipped) update g, the validator evaluates W - eta*g on a sample of the
miner's assigned batches A (`scored_assigned_batches` of them, drawn secretly) and on its own
random batches R (`eta` = evaluation step):

    gain(B, g)  = (L(B, W) - L(B, W - eta*g)) / L(B, W)        relative improvement (mean over A)
    score       = gain(R, g)

The indicator asks whether the miner trained on its own data. A batch can be easy or hard to
improve whoever trained, so the own-data advantage is measured against a reference update ref_i
made without miner i's data:

    margin    = (gain(A, g) - gain(A, ref_i)) - (gain(R, g) - gain(R, ref_i))
    indicator = +1 if margin > indicator_margin * |gain(R, ref_i)|
                   and gain(R, g) > useful_share * max(gain(R, ref_i), 0) else -1

ref_i is the mean direction of the round's OTHER admissible updates, at the median norm
(leave-one-out): updates trained on other data, so they help A only as much as any batch of the
corpus; an update trained on A helps A more, one trained elsewhere (a thief's) does not. A
reference that contained g itself would share its own-data advantage, and with a single miner it
would BE g: margin 0 and indicator -1 every round, so a lone miner never trained. On the embedded
GPT this difference-in-differences separates honest miners from thieves far better than
comparing gain(A, g) with gain(R, g) alone (`pulse bench gauntlet`).

The second condition asks whether the update is work at all. A random direction at an honest
norm costs nothing and gains nothing on average, but its margin is a coin flip (+1 in about 2
rounds of 5 on the embedded GPT), enough for a run of lucky rounds to build a record. Measured
there, an honest update gains on R 1.0x to 1.8x what ref_i gains (10th to 90th percentile), a
random one -0.1x to 0.09x. A quarter of the reference's gain was reached by 143 of 144 honest
updates and by 2 of 72 random ones (whose margins were -1 in those rounds): its record stays at zero.

With no other admissible update there is no reference (ref_i = 0): the indicator is then the plain
comparison gain(A, g) - gain(R, g) > 0, which with a fresh batch every inner step is mostly batch
difficulty (an honest lone miner fails it about every other round). So it is reported but neither
recorded in the miner's moving average nor a gate: a lone update is aggregated when its score (its
gain on the validator's secret random batches) is positive (`gauntlet.select`). Alone, there is
nobody's work to take; whatever helps random data helps the run.

Copies: a `Sketch` keeps an update's nonzero values at every stride-th coordinate (offset chosen
per round by the validator), a few kilobytes, so a round compares all pairs without holding
any decoded update.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from protocol.identity import Identity, verify_signature
from protocol.state import State
from validator.sketchmatch import shared_and_dot

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

    def key(self, purpose: str) -> bytes:
        """32 secret bytes for `purpose` (e.g. the admission tickets of the round)."""
        return hashlib.sha256(self.digest + b"/key/" + purpose.encode()).digest()

    def random_seeds(self, count: int) -> list[int]:
        return [self.number("random-batch", i) for i in range(count)]

    def assigned_indices(self, miner: str, batches: int, count: int) -> list[int]:
        """`count` distinct indices of a miner's `batches` assigned batches (all if fewer), ascending."""
        ranked = sorted(range(batches), key=lambda j: self.number("assigned", miner, j))
        return sorted(ranked[:count])

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
    """Relative gains of a submission's update (g) and of the round's reference update (ref).

    Only `random` is measured when g does not gain on R, and `random_ref` beside it when g gains
    there no more than `useful` asks: the others are NaN then (`measured` is False) and the
    indicator is -1, as it would be whatever they were (`RoundEvaluation.gains`)."""

    assigned: float  # gain(A, g)
    random: float  # gain(R, g): the score
    assigned_ref: float  # gain(A, ref)
    random_ref: float  # gain(R, ref)

    @classmethod
    def on_random(cls, random: float, random_ref: float = math.nan) -> Gains:
        """Gains measured on R alone (the update's, and its reference's when known): not `measured`."""
        return cls(assigned=math.nan, random=random, assigned_ref=math.nan, random_ref=random_ref)

    @property
    def measured(self) -> bool:
        return not math.isnan(self.assigned)

    @property
    def margin(self) -> float:
        return (self.assigned - self.assigned_ref) - (self.random - self.random_ref)

    def indicator(self, margin_fraction: float, useful_share: float) -> int:
        if not self.measured:
            return -1
        own = self.margin > margin_fraction * abs(self.random_ref)
        return 1 if own and useful(self.random, self.random_ref, useful_share) else -1


def useful(random: float, random_ref: float, share: float) -> bool:
    """The indicator's second condition: the update gains on R more than `share` of what its
    reference gains there (of nothing, when the reference loses)."""
    return random > share * max(random_ref, 0.0)


def moving_average(average: float, indicator: int, decay: float) -> float:
    """decay x average + (1 - decay) x indicator, floored at 0: a record below zero would hold against a
    key nothing that a fresh key (free, starting at 0) escapes, so it only keeps an honest miner with
    a bad start out for longer. With the floor a bad start fades at once."""
    return max(0.0, decay * average + (1.0 - decay) * indicator)


class RoundEvaluation:
    """Loss measurements of one round, sharing what every submission needs.

    Losses at W are measured once for R, and for a candidate's sampled assigned batches A when it is
    first measured on them; each submission then costs the forward passes on its A and on R with its
    update loaded, then with its reference, and a load of W for its losses there.

    Its R comes first. An update that does not gain on R (relative gain <= 0) fails the indicator's
    second condition whatever its own-data margin (useful_share >= 0), and selection refuses it
    (no gain on random data): its gains on A and the reference's are not measured, which costs it
    2 forward passes instead of 4 + 2 x (|A| + |R|) (16 with the defaults). Random directions,
    sign flips and other updates a flood of fresh keys can send without training therefore cost the
    validator an eighth of what an honest update does.

    The reference's gain on R comes next, measured once per distinct reference (`reference_key`:
    every newcomer of a round with established keys has the same one). An update that gains no more
    than `useful_share` of it fails the same condition (`useful`), so its gains on A are not measured
    either: a random direction that happens to gain a little on R costs 2 passes once its
    reference's gain is known, and |R| + |A| before. `complete` measures everything anyway (a
    miner's receipt compares every figure).

    A gain on R is kept per (update key, step) once measured (`random_gain`): the norm gate of a
    round no established key sent to weighs each payload by its gain at its own norm per unit of
    norm (gauntlet.py), and an update evaluated at that same scale later does not pay for it twice.
    The assigned batches may be given after construction (`assign`), once the gate has decided who
    is evaluated.
    """

    def __init__(
        self,
        evaluator: Evaluator,
        weights: State,
        step: float,
        random: Sequence[Batch],
        assigned: Mapping[int, Sequence[Batch]],  # candidate index -> its sampled assigned batches A
        useful_share: float = 0.0,  # the indicator's (`useful`): below it, A is not measured
    ) -> None:
        self.evaluator, self.weights, self.step = evaluator, weights, step
        self.random, self.assigned = list(random), {i: list(bs) for i, bs in assigned.items()}
        self.useful_share = useful_share
        evaluator.load(weights)
        self.before_r = self._loss_r()
        self.before_a: dict[int, list[float]] = {}  # losses at W on a candidate's A, once it needs them
        self.reference_r: dict[Hashable, float] = {}  # reference_key -> the reference's gain on R
        self.random_r: dict[tuple[Hashable, float], float] = {}  # (update key, step) -> its gain on R

    def assign(self, assigned: Mapping[int, Sequence[Batch]]) -> None:
        """Give candidates' sampled assigned batches A (index -> batches)."""
        self.assigned.update({i: list(bs) for i, bs in assigned.items()})

    def random_gain(self, update: State, scale: float = 1.0, *, key: Hashable | None = None) -> float:
        """Relative gain on R of W - step * `scale` * `update`, measured once per (`key`, scale)
        (None: measured every time)."""
        return self._random(update, self.step * scale, key)[0]

    def _random(self, update: State, step: float, key: Hashable | None) -> tuple[float, bool]:
        """The gain on R at `step` and whether the update is left loaded (not when it was kept)."""
        kept = self.random_r.get((key, step)) if key is not None else None
        if kept is not None:
            return kept, False
        gain = self._score(update, step)
        if key is not None:
            self.random_r[(key, step)] = gain
        return gain, True

    def gains(
        self,
        index: int,
        update: State,
        scale: float,
        reference: State | None,
        *,
        reference_key: Hashable | None = None,
        update_key: Hashable | None = None,
        complete: bool = False,
    ) -> Gains:
        """Gains of `update` * `scale` and of `reference` for candidate `index` (its A was given at
        construction or by `assign`); without a reference, the reference gains are 0. Candidates
        whose references are the same pass the same `reference_key` (None: never the same); equal
        updates may pass an `update_key` (see `random_gain`). Only the gains on R when the update
        does not gain on R, or not usefully (see above), unless `complete`."""
        random, loaded = self._random(update, self.step * scale, update_key)
        if not random > 0 and not complete:
            return Gains.on_random(random)

        def losses_a() -> list[float]:  # the update's losses on A, loaded first if its R gain was kept
            if not loaded:
                self.evaluator.load(self.weights, update, self.step * scale)
            return self._losses_a(index)

        if reference is None:
            return Gains(self._mean_gain(index, losses_a()), random, 0.0, 0.0)

        def stop(random_ref: float) -> bool:  # the indicator is -1 whatever A says
            return not (useful(random, random_ref, self.useful_share) or complete)

        random_ref = self.reference_r.get(reference_key) if reference_key is not None else None
        if random_ref is not None and stop(random_ref):
            return Gains.on_random(random, random_ref)
        after_a = losses_a()
        if random_ref is None:
            random_ref = self._score(reference, self.step)
            if reference_key is not None:
                self.reference_r[reference_key] = random_ref
            if stop(random_ref):
                return Gains.on_random(random, random_ref)
        else:
            self.evaluator.load(self.weights, reference, self.step)
        assigned_ref = self._mean_gain(index, self._losses_a(index))
        return Gains(self._mean_gain(index, after_a), random, assigned_ref, random_ref)

    def _score(self, update: State, step: float) -> float:
        """Relative gain on R of W - step * update, which is left loaded."""
        self.evaluator.load(self.weights, update, step)
        return relative_gain(self.before_r, self._loss_r())

    def _losses_a(self, index: int) -> list[float]:
        """Losses of the loaded weights on candidate `index`'s A."""
        return [self.evaluator.loss(b) for b in self.assigned[index]]

    def _mean_gain(self, index: int, after: Sequence[float]) -> float:
        """Mean relative gain on candidate `index`'s A from its losses `after`; the losses at W are
        measured on first use (the weights are left at W)."""
        if index not in self.before_a:
            self.evaluator.load(self.weights)
            self.before_a[index] = self._losses_a(index)
        gains = [relative_gain(before, a) for before, a in zip(self.before_a[index], after, strict=True)]
        return sum(gains) / max(len(gains), 1)

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
            sample = update[name].reshape(-1)[offset::stride].double().cpu().numpy()
            nz = np.flatnonzero(sample)
            positions.append(nz + base)
            values.append(sample[nz])
            base += len(sample)
        return cls(np.concatenate(positions), np.concatenate(values))

    def overlap(self, other: Sketch) -> float:
        """Shared nonzero positions over the smaller update's count (0 when either is empty)."""
        return self.compare(other)[0]

    def cosine(self, other: Sketch) -> float:
        """Dot product on the shared positions over the product of both sketches' whole norms."""
        return self.compare(other)[1]

    def compare(self, other: Sketch) -> tuple[float, float]:
        """(`overlap`, `cosine`) with `other`, from one merge of the sorted positions (sketchmatch.py)."""
        smaller = min(len(self.positions), len(other.positions))
        if smaller == 0:
            return 0.0, 0.0
        shared, dot = shared_and_dot(self.positions, self.values, other.positions, other.values)
        norms = self.norm * other.norm
        return shared / smaller, dot / norms if norms > 0 else 0.0

    @functools.cached_property
    def norm(self) -> float:
        return float(np.linalg.norm(self.values))


@dataclass(frozen=True)
class CopyCandidate:
    index: int  # arrival order
    payload_sha256: str
    sketch: Sketch
    margin: float
    indicator: int
    average: float = 0.0  # the miner's indicator moving average with this round's indicator in it
    prior: float = 0.0  # the same average before this round: the miner's record


def copy_groups(items: Sequence[tuple[str, Sketch]], overlap: float, cosine: float) -> list[list[int]]:
    """Positions in `items` ((payload SHA-256, sketch) pairs) that are copies of each other, one list
    per group of two or more, ascending: the same payload hash, or sketches that overlap by at least
    `overlap` with cosine at least `cosine` (transitively)."""
    parent = list(range(len(items)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}  # payload hash -> its first position: exact copies are compared once
    for j, (later_hash, later) in enumerate(items):
        if later_hash in first:
            parent[root(j)] = root(first[later_hash])
            continue
        for i in first.values():
            if root(i) == root(j):
                continue  # already one group: the comparison would change nothing
            shared, cos = items[i][1].compare(later)
            if shared >= overlap and cos >= cosine:
                parent[root(j)] = root(i)
        first[later_hash] = j
    groups: dict[int, list[int]] = {}
    for i in range(len(items)):
        groups.setdefault(root(i), []).append(i)
    return [members for members in groups.values() if len(members) > 1]


def copy_owners(items: Sequence[CopyCandidate], overlap: float, cosine: float, lead: float = 0.0) -> dict[int, int]:
    """index -> index of the submission it copies, for every copy among `items`.

    Submissions in one `copy_groups` group: its owner is the member whose own data the update
    helps, on the record. Only a record counts: the member with the highest indicator average before
    this round owns the group if that average is positive and leads every other member's by at least
    `lead`; else no member owns it and all of them are copies. One round's own-data margin cannot
    tell the author of an update from its copier: a miner trains once on each of its fresh batches,
    so the advantage on a sample of them is small against the noise, and a copier that got +1 by
    chance would take the update. The lead is what keeps one lucky round from deciding it: with a
    decay of 0.95 one round moves a record by 0.05, so a lead of 0.15 needs at least two rounds in
    which the owner's indicator beat the other's. Refusing the whole group costs its author that
    round's update (its indicator still counts, so its record grows and it owns the group once it
    leads) and gives a copier nothing until it has out-scored its victim round after round on data it
    did not train on. Templar penalizes the later uploader; the record is used instead because a
    thief that trains on its victim's assignment and uploads first would turn its victim into the copy.
    """
    owners: dict[int, int] = {}
    for members in copy_groups([(c.payload_sha256, c.sketch) for c in items], overlap, cosine):
        best = max(members, key=lambda i: (items[i].prior, items[i].average, items[i].indicator, items[i].margin, -i))
        runner_up = max(items[i].prior for i in members if i != best)
        if items[best].prior > 0 and items[best].prior - runner_up >= lead:
            for i in members:
                if i != best:
                    owners[items[i].index] = items[best].index
            continue
        for k, i in enumerate(members):  # nobody leads on record: each is named a copy of another member
            owners[items[i].index] = items[members[k - 1]].index
    return owners
