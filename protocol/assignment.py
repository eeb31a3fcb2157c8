"""Data assignment: which batches a miner trains on in a round, and the digest it announces.

Miners and the validator derive the same assignment from public facts only, so the validator
can redraw a miner's data and check that the update helps it (the Gauntlet indicator):

    seed_j = SHA-256(DOMAIN | run id (32 bytes) | round u64 | miner key (32 bytes) | j u32)[:8] >> 1
    for j in 0 .. batches-1; inner step s trains on batch seed_{s mod batches}

A batch seed names a batch of the run's training split (`node/learn/data.py` draws it). A miner cycles
over a few batches rather than drawing a fresh one per step: the validator evaluates on one of
them, and an update that saw its batch several times helps it clearly more than random data.

The data digest (`SubmissionHeader.data_digest`) is the SHA-256 of the seeds in order:
    SHA-256(DIGEST_DOMAIN | u32 count | u64 seed ...)
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

DOMAIN = b"pulse/assignment/v1\x00"
DIGEST_DOMAIN = b"pulse/data-digest/v1\x00"
MAX_BATCHES = 1 << 16


@dataclass(frozen=True)
class Assignment:
    """The batches `miner` (64-hex public key) trains on in `round` of `run_id`."""

    run_id: str
    round: int
    miner: str
    batches: int

    def __post_init__(self) -> None:
        if not 1 <= self.batches <= MAX_BATCHES:
            raise ValueError(f"an assignment has 1..{MAX_BATCHES} batches, got {self.batches}")
        if len(bytes.fromhex(self.run_id)) != 32 or len(bytes.fromhex(self.miner)) != 32:
            raise ValueError("run id and miner key must be 32 bytes as hex")

    @cached_property
    def seeds(self) -> tuple[int, ...]:
        """One 63-bit seed per assigned batch."""
        prefix = DOMAIN + bytes.fromhex(self.run_id) + struct.pack(">Q", self.round) + bytes.fromhex(self.miner)
        return tuple(
            int.from_bytes(hashlib.sha256(prefix + struct.pack(">I", j)).digest()[:8], "big") >> 1
            for j in range(self.batches)
        )

    def step_seed(self, step: int) -> int:
        """The batch seed of inner step `step` (0-based within the round)."""
        return self.seeds[step % self.batches]

    @property
    def digest(self) -> str:
        return data_digest(self.seeds)


def data_digest(seeds: Sequence[int]) -> str:
    """Hex SHA-256 naming the batch seeds a miner trained on, in order."""
    h = hashlib.sha256(DIGEST_DOMAIN)
    h.update(struct.pack(">I", len(seeds)))
    for seed in seeds:
        h.update(struct.pack(">Q", seed))
    return h.hexdigest()
