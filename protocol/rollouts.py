"""Rollout batches: what an inference worker publishes in an RL run, as bounded binary bytes.

A worker holding the BF16 weights of round r generates G completions for each of its prompts,
scores them, and publishes one batch as a blob (its SHA-256 is announced in the DHT with a signed
`RolloutAnnouncement`). Layout, every count bounded by `RolloutLimits`:

    magic "PRB1" | run id (32) | round varint | worker key (32) | state hash (32)
    groups varint, then per group:
        prompt (varint length + bytes) | completions varint | per completion: bytes, reward f32

Rewards are the worker's claims: whoever uses a batch recomputes them from prompt and completion
(the reward is a deterministic function of both) and rejects a batch whose claims disagree.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from protocol.errors import MalformedPayload, NonFiniteValues, SizeLimitExceeded, UnknownVersion
from protocol.wire import Reader, Writer

MAGIC = b"PRB1"


@dataclass(frozen=True)
class RolloutLimits:
    """Caps a reader enforces before allocating anything."""

    max_groups: int = 256
    max_group_size: int = 64
    max_prompt_bytes: int = 1024
    max_completion_bytes: int = 1024
    max_batch_bytes: int = 4 * 2**20


@dataclass(frozen=True)
class RolloutGroup:
    """G completions of one prompt and the reward claimed for each."""

    prompt: bytes
    completions: tuple[bytes, ...]
    rewards: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.rewards):
            raise ValueError("a group needs one reward per completion")


@dataclass(frozen=True)
class RolloutBatch:
    run_id: str  # 64 hex
    round: int  # the round whose weights generated it
    worker: str  # the worker's Ed25519 public key, 64 hex
    state_hash: str  # SHA-256 of the BF16 weights that generated it, 64 hex
    groups: tuple[RolloutGroup, ...]

    @property
    def completions(self) -> int:
        return sum(len(g.completions) for g in self.groups)

    @property
    def mean_reward(self) -> float:
        rewards = [r for g in self.groups for r in g.rewards]
        return sum(rewards) / max(len(rewards), 1)


def encode(batch: RolloutBatch) -> bytes:
    w = Writer()
    w.raw(MAGIC)
    w.raw(bytes.fromhex(batch.run_id))
    w.varint(batch.round)
    w.raw(bytes.fromhex(batch.worker))
    w.raw(bytes.fromhex(batch.state_hash))
    w.varint(len(batch.groups))
    for group in batch.groups:
        w.blob(group.prompt)
        w.varint(len(group.completions))
        for completion, reward in zip(group.completions, group.rewards, strict=True):
            w.blob(completion)
            w.raw(struct.pack("<f", reward))
    return w.getvalue()


def decode(data: bytes, limits: RolloutLimits = RolloutLimits()) -> RolloutBatch:
    """Parse a peer's batch; every way it can be wrong is a `ProtocolError` subclass."""
    if len(data) > limits.max_batch_bytes:
        raise SizeLimitExceeded(f"rollout batch is {len(data)} bytes, cap is {limits.max_batch_bytes}")
    r = Reader(data, "rollout batch")
    if bytes(r.raw(4)) != MAGIC:
        raise UnknownVersion("rollout batch: unknown magic")
    run_id = bytes(r.raw(32)).hex()
    round_ = r.varint(2**62, "round")
    worker = bytes(r.raw(32)).hex()
    state_hash = bytes(r.raw(32)).hex()
    groups = []
    for _ in range(r.varint(limits.max_groups, "groups")):
        prompt = bytes(r.blob(limits.max_prompt_bytes, "prompt length"))
        count = r.varint(limits.max_group_size, "group size")
        if count == 0:
            raise MalformedPayload("rollout batch: a group with no completions")
        completions, rewards = [], []
        for _ in range(count):
            completions.append(bytes(r.blob(limits.max_completion_bytes, "completion length")))
            (reward,) = struct.unpack("<f", r.raw(4))
            if not math.isfinite(reward):
                raise NonFiniteValues("rollout batch: a reward is not finite")
            rewards.append(reward)
        groups.append(RolloutGroup(prompt, tuple(completions), tuple(rewards)))
    r.expect_end()
    return RolloutBatch(run_id, round_, worker, state_hash, tuple(groups))
