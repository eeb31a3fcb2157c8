"""Fake miners for in-process Gauntlet runs: honest ones and one class per attack.

Every miner holds the round's BF16 weights and returns at most one `Submission` per round
(signed header envelope + payload), built with the real miner's step (`node/run/trainer.py`).
The attacks:

| kind      | does                                                                    | caught by             |
|-----------|-------------------------------------------------------------------------|-----------------------|
| copycat   | resubmits an earlier miner's payload; every other round a re-encoded near copy (x1.05) | copy detection |
| thief     | trains honestly on another miner's assignment, announces its own digest | indicator, copies     |
| signflip  | trains honestly, sends -1000 x its update                               | norm cap              |
| noise     | sends random noise at 1000 x its honest update's norm                   | norm cap              |
| freerider | sends a zero update                                                     | free-rider check      |
| nan       | a well-formed payload with NaN values (SparseLoCo centroids, dense raw) | decoder               |
| replay    | resends an honest miner's previous-round submission (this round's in round 0) | round / replay check |
| behind    | trains from the previous round's weights and says so                   | base state hash       |
| quietnoise | random noise at its honest update's norm: no work, passes every pre-check | score, indicator (work) |
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch

from node.learn.model import GPTConfig, build_gpt
from node.learn.train import Batch
from node.run.trainer import LMTrainer, MinerSpec
from protocol.assignment import Assignment
from protocol.codec import Codec
from protocol.identity import Identity
from protocol.signing import sign
from protocol.state import State
from protocol.wire import Reader
from validator.aggregate import global_norm
from validator.intake import Submission

T = TypeVar("T")
KINDS = ("copycat", "thief", "signflip", "noise", "freerider", "nan", "replay", "behind", "quietnoise")


@dataclass(frozen=True)
class FakeRun:
    """What every fake miner of a run shares: the miners' settings, the model, the training batches."""

    spec: MinerSpec
    gpt: GPTConfig
    batch: Callable[[int], Batch]  # seed -> training batch

    @property
    def codec(self) -> str:
        return self.spec.codec


@dataclass
class RoundView:
    """What a miner sees when it builds its submission for a round."""

    round: int
    weights: State  # BF16 W_r
    state_hash: str
    previous: tuple[State, str] | None  # (W_{r-1}, its hash), if any
    earlier: list[Submission] = field(default_factory=list)  # already published this round
    last_round: list[Submission] = field(default_factory=list)  # honest submissions of round r-1


def identity_for(label: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(f"pulse-fake-miner/{label}".encode()).digest())


class Miner:
    """An honest miner: the real miner's step (`LMTrainer`: H AdamW steps on its own assignment from
    W_r, compressed with error feedback), signed; attacks below change what it trains on or sends."""

    kind = "honest"

    def __init__(self, setup: FakeRun, identity: Identity) -> None:
        self.setup, self.identity = setup, identity
        self.trainer = LMTrainer(setup.spec, build_gpt(setup.gpt), identity, setup.batch)
        self.seconds: list[float] = []  # compute time of each round (train + compress)

    @property
    def key(self) -> str:
        return self.identity.public_hex

    @property
    def codec(self) -> Codec:
        return self.trainer.codec

    def role(self, round_: int) -> str:
        """The kind of submission this miner makes in `round_`."""
        return self.kind

    def assignment(self, round_: int, miner: str | None = None) -> Assignment:
        return self.trainer.assignment(round_, miner)

    def submit(self, view: RoundView) -> Submission | None:
        start = time.perf_counter()
        delta = self.trainer.train(view.round, view.weights)
        payload = self.trainer.compress(delta, view.weights)
        self.seconds.append(time.perf_counter() - start)
        return self.package(view.round, view.state_hash, payload)

    def train(self, weights: State, assignment: Assignment) -> State:
        """FP32 pseudo-gradient W - W_local after H steps on `assignment` from `weights`."""
        return self.trainer.train_on(assignment, weights)

    def compress(self, delta: State, weights: State) -> bytes:
        return self.trainer.compress(delta, weights)

    def package(self, round_: int, base_hash: str, payload: bytes, digest: str | None = None) -> Submission:
        header = self.trainer.header(round_, payload, base_hash, digest)
        return Submission(sign(self.identity, header).to_bytes(), payload)


class Thief(Miner):
    """Trains on a victim's assignment, at a slightly different learning rate so that its payload
    is not byte-identical to the victim's (which the exact-copy check would catch)."""

    kind = "thief"

    def __init__(self, setup: FakeRun, identity: Identity, victims: Sequence[str]) -> None:
        inner = setup.spec.inner.model_copy(update={"lr": setup.spec.inner.lr * 1.1})
        super().__init__(replace(setup, spec=replace(setup.spec, inner=inner)), identity)
        self.victims = list(victims)

    def submit(self, view: RoundView) -> Submission | None:
        victim = self.victims[view.round % len(self.victims)]
        delta = self.train(view.weights, self.assignment(view.round, victim))
        return self.package(view.round, view.state_hash, self.compress(delta, view.weights))


class Copycat(Miner):
    kind = "copycat"

    def submit(self, view: RoundView) -> Submission | None:
        if not view.earlier:
            return None
        victim = view.earlier[view.round % len(view.earlier)].read()
        if view.round % 2 == 0:
            return self.package(view.round, view.state_hash, victim)
        update = self.codec.decompress(victim, view.weights)
        near, _, _ = self.codec.compress({n: t * 1.05 for n, t in update.items()}, None, view.weights)
        return self.package(view.round, view.state_hash, near)


class SignFlip(Miner):
    kind = "signflip"

    def submit(self, view: RoundView) -> Submission | None:
        delta = self.train(view.weights, self.assignment(view.round))
        return self.package(
            view.round, view.state_hash, self.compress({n: -1000 * t for n, t in delta.items()}, view.weights)
        )


class Noise(Miner):
    """Random noise at `times` the norm of the update it would have sent (trained only to know that norm)."""

    kind = "noise"
    times = 1000.0

    def seed(self, round_: int) -> int:
        return round_

    def submit(self, view: RoundView) -> Submission | None:
        delta = self.train(view.weights, self.assignment(view.round))
        gen = torch.Generator().manual_seed(self.seed(view.round))
        noise = {n: torch.randn(t.shape, generator=gen) for n, t in delta.items()}
        scale = self.times * global_norm(delta) / global_norm(noise)
        return self.package(
            view.round, view.state_hash, self.compress({n: t * scale for n, t in noise.items()}, view.weights)
        )


class QuietNoise(Noise):
    """Noise at the norm itself (an attacker reads the published median instead of training), a
    direction of its own each round."""

    kind = "quietnoise"
    times = 1.0

    def seed(self, round_: int) -> int:
        return int.from_bytes(hashlib.sha256(f"{self.key}/{round_}".encode()).digest()[:7], "little")


def decoded_scale(codec: Codec, update: State, weights: State, norm: float) -> float:
    """The factor that makes what a validator decodes from `update`'s payload (compressed without error
    feedback) have `norm`: a codec sends a part of an update, so its own norm is not the one measured."""
    sent = global_norm(codec.decompress(codec.compress(update, None, weights)[0], weights))
    return norm / sent if sent > 0 else 1.0


class FreshNoise(Miner):
    """Random noise at a given norm (the published median), without training: what one of a flood of
    fresh keys can afford, a compression per payload. A direction of its own for each key."""

    kind = "freshnoise"

    def __init__(self, setup: FakeRun, identity: Identity, norm: float) -> None:
        super().__init__(setup, identity)
        self.norm = norm

    def submit(self, view: RoundView) -> Submission | None:
        seed = int.from_bytes(hashlib.sha256(f"{self.key}/{view.round}".encode()).digest()[:7], "little")
        gen = torch.Generator().manual_seed(seed)
        noise = {n: torch.randn(t.shape, generator=gen) for n, t in view.weights.items()}
        # no error feedback (`decoded_scale`, and here): it would carry the unscaled residual into the payload
        scale = decoded_scale(self.codec, noise, view.weights, self.norm)
        payload = self.codec.compress({n: t * scale for n, t in noise.items()}, None, view.weights)[0]
        return self.package(view.round, view.state_hash, payload)


class FreeRider(Miner):
    kind = "freerider"

    def submit(self, view: RoundView) -> Submission | None:
        zero = {n: torch.zeros(t.shape) for n, t in view.weights.items()}
        return self.package(view.round, view.state_hash, self.codec.compress(zero, None, view.weights)[0])


class NaNPayload(Miner):
    kind = "nan"

    def submit(self, view: RoundView) -> Submission | None:
        gen = torch.Generator().manual_seed(view.round)
        small = {n: torch.randn(t.shape, generator=gen) * 1e-3 for n, t in view.weights.items()}
        payload = poison_nan(self.codec.compress(small, None, view.weights)[0], view.weights, self.setup.codec)
        return self.package(view.round, view.state_hash, payload)


class Replay(Miner):
    kind = "replay"

    def submit(self, view: RoundView) -> Submission | None:
        pool = view.last_round or view.earlier
        return pool[view.round % len(pool)] if pool else None


class Behind(Miner):
    kind = "behind"

    def submit(self, view: RoundView) -> Submission | None:
        if view.previous is None or view.previous[1] == view.state_hash:  # no older state to lag behind
            return self.package(view.round, hashlib.sha256(b"no such state").hexdigest(), b"\x00")
        weights, base_hash = view.previous
        delta = self.train(weights, self.assignment(view.round))
        return self.package(view.round, base_hash, self.compress(delta, weights))


def poison_nan(payload: bytes, weights: State, codec: str) -> bytes:
    """`payload` with NaN where the format keeps its floats (the sender then hashes and signs it)."""
    r = Reader(payload, "payload")
    r.raw(4 + 1)  # magic, version (codec.py's common header)
    r.varint(1 << 32, "tensor count")
    r.raw(8)  # layout digest
    if codec == "dense":
        return payload[: len(payload) - r.remaining] + struct.pack("<f", float("nan")) * (r.remaining // 4)
    if codec == "sparseloco":
        r.varint(1 << 16, "k")
        r.u8()  # theta of the first 2-D tensor, then its 4 f32 centroids (sparseloco.py)
        at = len(payload) - r.remaining
        return payload[:at] + struct.pack("<4f", *[float("nan")] * 4) + payload[at + 16 :]
    raise ValueError(f"no NaN poisoning for codec {codec!r}")


ADVERSARIES: dict[str, type[Miner]] = {
    "copycat": Copycat,
    "signflip": SignFlip,
    "noise": Noise,
    "quietnoise": QuietNoise,
    "freerider": FreeRider,
    "nan": NaNPayload,
    "replay": Replay,
    "behind": Behind,
}


def make_adversary(kind: str, setup: FakeRun, identity: Identity, victims: Sequence[str]) -> Miner:
    if kind == "thief":
        return Thief(setup, identity, victims)
    return ADVERSARIES[kind](setup, identity)


class Shapeshifter(Miner):
    """One identity playing a different attack each round: kinds[(round + offset) % len(kinds)]."""

    def __init__(
        self, setup: FakeRun, identity: Identity, kinds: Sequence[str], offset: int, victims: Sequence[str]
    ) -> None:
        self.setup, self.identity, self.kinds, self.offset = setup, identity, list(kinds), offset
        self.victims = list(victims)
        self.roles: dict[str, Miner] = {}  # built on first use: only attacks that train hold a model
        self.seconds: list[float] = []

    def role(self, round_: int) -> str:
        return self.kinds[(round_ + self.offset) % len(self.kinds)]

    def submit(self, view: RoundView) -> Submission | None:
        kind = self.role(view.round)
        if kind not in self.roles:
            self.roles[kind] = make_adversary(kind, self.setup, self.identity, self.victims)
        return self.roles[kind].submit(view)


def arrival_order(items: Sequence[T], seed: int) -> list[T]:
    """`items` in a seeded random order: the order a round's submissions arrive in."""
    gen = torch.Generator().manual_seed(seed)
    return [items[i] for i in torch.randperm(len(items), generator=gen).tolist()]
