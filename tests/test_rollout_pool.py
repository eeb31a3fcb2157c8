"""The validator's rollout pool: honest batches go in; lying workers are refused, named and left out."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from node.events import Events
from node.learn.rl.config import RLConfig
from node.learn.rl.task import answer, problems_for, reward
from node.net.blobstore import BlobStore
from node.roles.rl.pool import PENALTY_ROUNDS, PoolKeeper, check_batch
from protocol import rollouts
from protocol.errors import TransferError
from protocol.identity import Identity
from protocol.messages import RolloutAnnouncement, RolloutPool, WireModel
from protocol.rollouts import RolloutBatch, RolloutGroup
from protocol.signing import Verified, open_signed, sign

RUN = hashlib.sha256(b"rl-run").hexdigest()
CFG = RLConfig(group_size=4, prompts_per_batch=3, max_staleness=1, pool_wait_seconds=0.2)
STATES = {2: hashlib.sha256(b"w2").hexdigest(), 3: hashlib.sha256(b"w3").hexdigest()}


def honest_batch(worker: Identity, round_: int = 3) -> RolloutBatch:
    groups = []
    for prompt in problems_for(RUN, round_, worker.public_hex, CFG.prompts_per_batch, CFG):
        completions = (answer(prompt), b"0\n", b"x", answer(prompt))
        groups.append(RolloutGroup(prompt, completions, tuple(reward(prompt, c) for c in completions)))
    return RolloutBatch(RUN, round_, worker.public_hex, STATES[round_], tuple(groups))


def announce(worker: Identity, batch: RolloutBatch) -> tuple[RolloutAnnouncement, bytes]:
    data = rollouts.encode(batch)
    a = RolloutAnnouncement(
        run_id=RUN,
        round=batch.round,
        state_hash=batch.state_hash,
        blob_sha256=hashlib.sha256(data).hexdigest(),
        blob_size=len(data),
        groups=len(batch.groups),
        mean_reward=batch.mean_reward,
    )
    return a, data


def lie_about_reward(batch: RolloutBatch) -> RolloutBatch:
    first = batch.groups[0]
    inflated = replace(first, rewards=tuple(1.0 for _ in first.rewards))
    return replace(batch, groups=(inflated, *batch.groups[1:]))


def test_an_honest_batch_passes_every_check() -> None:
    worker = Identity.generate()
    batch = honest_batch(worker)
    a, _ = announce(worker, batch)
    assert check_batch(batch, a, worker.public_hex, RUN, STATES, CFG) is None


@pytest.mark.parametrize(
    ("lie", "reason"),
    [
        (lie_about_reward, "claimed reward"),
        (lambda b: replace(b, state_hash=hashlib.sha256(b"other").hexdigest()), "state other than"),
        (lambda b: replace(b, groups=tuple(reversed(b.groups))), "prompts"),
        (lambda b: replace(b, groups=b.groups[:2]), "group count"),
        (lambda b: replace(b, worker=Identity.generate().public_hex), "another run, round or worker"),
        (lambda b: replace(b, round=2), "another run, round or worker"),
    ],
)
def test_a_lying_batch_is_refused_with_its_reason(lie: object, reason: str) -> None:
    worker = Identity.generate()
    honest = honest_batch(worker)
    a, _ = announce(worker, honest)
    assert callable(lie)
    bad = lie(honest)
    if bad.state_hash != honest.state_hash:  # a consistent lie: the announcement names the same state
        a = a.model_copy(update={"state_hash": bad.state_hash})
    problem = check_batch(bad, a, worker.public_hex, RUN, STATES, CFG)
    assert problem is not None and reason in problem


def test_a_batch_from_a_state_the_validator_never_had_is_refused() -> None:
    worker = Identity.generate()
    batch = honest_batch(worker, round_=2)
    a, _ = announce(worker, batch)
    assert "keeps no state" in (check_batch(batch, a, worker.public_hex, RUN, {3: STATES[3]}, CFG) or "")
    wrong = {2: STATES[3]}  # the validator's round-2 state is another one
    assert "state other than" in (check_batch(batch, a, worker.public_hex, RUN, wrong, CFG) or "")


@dataclass
class FakePeer:
    """What `PoolKeeper` needs of a `Peer`: DHT reads, blob fetches, and a store."""

    store: BlobStore
    records: dict[int, list[Verified[RolloutAnnouncement]]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)

    async def get(self, kind: type[WireModel], round_: int) -> list[Verified[RolloutAnnouncement]]:
        assert kind is RolloutAnnouncement
        return self.records.get(round_, [])

    async def from_validator(self, kind: type[WireModel], round_: int) -> RolloutPool | None:
        return None

    async def fetch(self, sha256: str, size: int, round_: int) -> Path:
        if sha256 not in self.blobs:
            raise TransferError("no holder")
        return self.store.path(self.store.put(self.blobs[sha256]))

    def hold(self, sha256: str) -> None:
        self.held.append(sha256)

    def publish(self, worker: Identity, batch: RolloutBatch, data: bytes | None = None) -> None:
        a, encoded = announce(worker, batch)
        self.blobs[a.blob_sha256] = encoded if data is None else data
        verified = open_signed(sign(worker, a).to_bytes(), run_id=RUN, expect=RolloutAnnouncement)
        self.records.setdefault(batch.round, []).append(verified)


def test_the_pool_takes_honest_batches_and_penalizes_liars(tmp_path: Path) -> None:
    peer = FakePeer(BlobStore(tmp_path / "blobs"))
    honest, liar, garbler = Identity.generate(), Identity.generate(), Identity.generate()
    peer.publish(honest, honest_batch(honest))
    peer.publish(honest, honest_batch(honest, round_=2))
    peer.publish(liar, lie_about_reward(honest_batch(liar)))
    g = honest_batch(garbler)
    peer.publish(garbler, g, data=rollouts.encode(g) + b"\x00")  # announced hash matches, bytes are bad
    keeper = PoolKeeper(peer, CFG, RUN, Events("validator"))  # type: ignore[arg-type]

    pool, groups = asyncio.run(keeper.build(3, STATES))

    assert [(e.worker, e.round) for e in pool.entries] == [(honest.public_hex, 3), (honest.public_hex, 2)]
    assert [len(g) for g in groups] == [CFG.prompts_per_batch] * 2
    refused = {r.worker: r.reason for r in pool.rejections}
    assert set(refused) == {liar.public_hex, garbler.public_hex}
    assert "claimed reward" in refused[liar.public_hex]
    assert "malformed" in refused[garbler.public_hex]
    assert keeper.penalized[liar.public_hex] == 3 + PENALTY_ROUNDS
    assert set(peer.held) == {e.blob_sha256 for e in pool.entries}

    # next round the liar's honest batch is still left out: it is serving its penalty
    peer.publish(liar, honest_batch(liar))
    pool4, _ = asyncio.run(keeper.build(3, STATES))
    assert liar.public_hex not in {e.worker for e in pool4.entries}
