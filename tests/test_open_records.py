"""Open DHT kinds (heartbeats, rollout announcements, submission headers) under a storage budget that
fresh keys cannot turn against the run: rounds far ahead and long expiries are refused, each kind
has its own quota, a flood of records nobody needs evicts itself first, and a full key still takes
a newcomer (no first 256 signers keep it)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path

from node.net.dht import dht_key_id, sign_for
from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.net.records import OPEN_MAX_TTL, POLICIES, ROUND_WINDOW, RecordRules, StoreBudget
from protocol.identity import Identity
from protocol.messages import Heartbeat, PoolEntry, RolloutAnnouncement, RolloutPool, RoundResult, ScoredSubmission
from protocol.signing import SignedMessage, sign
from tests.helpers import commitments

RUN = hashlib.sha256(b"open-records-run").hexdigest()
VALIDATOR = Identity.generate()
RULES = RecordRules(RUN, (VALIDATOR.public_hex,))


def beat(identity: Identity, round_: int) -> Heartbeat:
    return Heartbeat(run_id=RUN, round=round_, role="miner", peer_id="1" * 46, state_hash=None, blobs=(), sent_at=1)


def announcement(round_: int) -> RolloutAnnouncement:
    h = hashlib.sha256(str(round_).encode()).hexdigest()
    return RolloutAnnouncement(
        run_id=RUN, round=round_, state_hash=h, blob_sha256=h, blob_size=100, groups=1, mean_reward=0.0
    )


def result(round_: int, aggregated: tuple[str, ...] = ()) -> RoundResult:
    h = hashlib.sha256(str(round_).encode()).hexdigest()
    selected = tuple(ScoredSubmission(sender=k, payload_sha256=h, score=1.0) for k in aggregated)
    return RoundResult(
        run_id=RUN, round=round_, selected=selected, rejections=(), base_state_hash=h, patch_sha256=h,
        patch_size=1, new_state_hash=h, **commitments(str(round_)),
    )  # fmt: skip


def admit(budget: StoreBudget, signed: SignedMessage) -> tuple[bool, tuple[tuple[bytes, bytes], ...]]:
    admitted = budget.admit(
        dht_key_id(RUN, signed.kind, signed.round), signed.sender, signed.to_bytes(), signed.expires_at
    )
    return admitted.stored, admitted.evict


def test_records_for_rounds_beyond_the_head_are_refused() -> None:
    budget = StoreBudget(RULES)
    assert admit(budget, sign_for(VALIDATOR, beat(VALIDATOR, 10), 60))[0]  # the head is round 10
    me = Identity.generate()
    assert admit(budget, sign_for(me, beat(me, 10 + ROUND_WINDOW), 60))[0]
    assert not admit(budget, sign_for(me, beat(me, 11 + ROUND_WINDOW), 60))[0]
    assert not admit(budget, sign_for(me, beat(me, 2**62), 60))[0]


def test_a_storage_told_the_head_by_its_node_refuses_far_rounds() -> None:
    """A storage that has seen no validator record takes the run's start (round 0) for the head: it keeps
    the first rounds and refuses far ones (before, any round, so a flood filled future keys in advance);
    told the head its node read (`PulseDHT.get`), it keeps the rounds near that head and refuses what lies
    beyond it, and a lower round told later changes nothing."""
    budget = StoreBudget(RULES)
    me = Identity.generate()
    assert not admit(budget, sign_for(me, beat(me, 2**40), 60))[0]
    assert not admit(budget, sign_for(me, beat(me, 1 + ROUND_WINDOW), 60))[0]
    assert admit(budget, sign_for(me, beat(me, ROUND_WINDOW), 60))[0]
    budget.learn_head(10)
    budget.learn_head(2)
    other = Identity.generate()
    assert admit(budget, sign_for(other, beat(other, 10 + ROUND_WINDOW), 60))[0]
    assert not admit(budget, sign_for(other, beat(other, 11 + ROUND_WINDOW), 60))[0]


def test_open_records_expiring_far_ahead_are_refused_and_nodes_sign_within_the_bound() -> None:
    budget = StoreBudget(RULES)
    me = Identity.generate()
    too_long = sign(me, beat(me, 1), expires_ms=int((time.time() + OPEN_MAX_TTL + 600) * 1000))
    assert not admit(budget, too_long)[0]
    capped = sign_for(me, beat(me, 1), 24 * 3600)  # what a node with a day-long record TTL signs
    assert capped.expires_at <= time.time() + OPEN_MAX_TTL + 1
    assert admit(budget, capped)[0]


def test_a_flood_of_one_kind_does_not_evict_another() -> None:
    budget = StoreBudget(RULES, max_open_bytes=40_000)
    budget.learn_head(5)
    worker = Identity.generate()
    rollouts = sign_for(worker, announcement(5), 600)
    assert admit(budget, rollouts)[0]
    evicted: list[tuple[bytes, bytes]] = []
    for i in range(200):
        me = Identity.generate()
        stored, evict = admit(budget, sign_for(me, beat(me, 5 + i % 3), 600))
        assert stored
        evicted += evict
    assert evicted, "the flood filled the heartbeat quota"
    assert (dht_key_id(RUN, "rollouts", 5), worker.public_key) not in evicted
    assert budget.bytes <= 40_000


def test_a_flood_for_far_rounds_evicts_itself_before_the_current_round() -> None:
    """No validator record seen yet (a peer that only serves far keys): a flood of heartbeats for far
    rounds is refused outright. Within the window of a known head, 10x the quota of heartbeats for the
    rounds ahead evict each other, never the honest record of the current round (before, the oldest
    stored went first)."""
    budget = StoreBudget(RULES, max_open_bytes=40_000)
    honest = Identity.generate()
    assert admit(budget, sign_for(honest, beat(honest, 2), 600))[0]
    for i in range(50):
        me = Identity.generate()
        assert not admit(budget, sign_for(me, beat(me, 10**6 + i), 600))[0]
    budget.learn_head(5)
    assert admit(budget, sign_for(honest, beat(honest, 5), 600))[0]
    evicted: list[tuple[bytes, bytes]] = []
    for i in range(200):
        me = Identity.generate()
        evicted += admit(budget, sign_for(me, beat(me, 6 + i % ROUND_WINDOW), 600))[1]
    assert evicted and (dht_key_id(RUN, "heartbeat", 5), honest.public_key) not in evicted


def test_past_the_head_the_farthest_rounds_go_first() -> None:
    budget = StoreBudget(RULES, max_open_bytes=40_000)
    assert admit(budget, sign_for(VALIDATOR, beat(VALIDATOR, 100), 60))[0]
    honest = Identity.generate()
    assert admit(budget, sign_for(honest, beat(honest, 100), 600))[0]
    evicted: list[tuple[bytes, bytes]] = []
    for i in range(200):
        me = Identity.generate()
        evicted += admit(budget, sign_for(me, beat(me, i % 50), 600))[1]  # old rounds nobody reads
    assert evicted and (dht_key_id(RUN, "heartbeat", 100), honest.public_key) not in evicted


def test_a_full_key_takes_a_fresh_signer_and_keeps_those_with_standing() -> None:
    """Sybils fill a key first: a fresh honest signer still gets in (before: refused while the sybils'
    records lived), and a key a validator aggregated is never displaced by a fresh one."""
    small = {**POLICIES, "heartbeat": replace(POLICIES["heartbeat"], max_signers=4)}
    budget = StoreBudget(RecordRules(RUN, (VALIDATOR.public_hex,), policies=small))
    established = Identity.generate()
    assert admit(budget, sign_for(VALIDATOR, result(7, (established.public_hex,)), 60))[0]
    assert admit(budget, sign_for(established, beat(established, 8), 600))[0]
    for _ in range(3):
        me = Identity.generate()
        assert admit(budget, sign_for(me, beat(me, 8), 600))[0]
    fresh = Identity.generate()
    stored, evict = admit(budget, sign_for(fresh, beat(fresh, 8), 600))
    assert stored and len(evict) == 1 and evict[0][1] != established.public_key
    for _ in range(50):
        me = Identity.generate()
        _, evict = admit(budget, sign_for(me, beat(me, 8), 600))
        assert established.public_key not in {owner for _, owner in evict}


def test_a_worker_whose_rollouts_the_pool_took_keeps_its_announcements_through_a_flood() -> None:
    """Rollout announcements are how the pool finds batches: a worker the validator's pool took has
    standing, so a flood of fresh announcers displaces one of theirs, never the worker's."""
    small = {**POLICIES, "rollouts": replace(POLICIES["rollouts"], max_signers=4)}
    budget = StoreBudget(RecordRules(RUN, (VALIDATOR.public_hex,), policies=small))
    worker = Identity.generate()
    h = hashlib.sha256(b"batch").hexdigest()
    pool = RolloutPool(
        run_id=RUN, round=5, entries=(PoolEntry(worker=worker.public_hex, round=4, blob_sha256=h, blob_size=100),),
        rejections=(),
    )  # fmt: skip
    assert admit(budget, sign_for(VALIDATOR, pool, 60))[0]
    assert admit(budget, sign_for(worker, announcement(6), 600))[0]
    for _ in range(60):
        me = Identity.generate()
        stored, evict = admit(budget, sign_for(me, announcement(6), 600))
        assert stored and worker.public_key not in {owner for _, owner in evict}


def test_an_honest_heartbeat_is_readable_after_256_sybils_filled_its_key(tmp_path: Path) -> None:
    net = MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5))
    for _ in range(POLICIES["heartbeat"].max_signers):
        me = Identity.generate()
        assert net.store(sign_for(me, beat(me, 3), 600))
    honest = Identity.generate()
    assert net.store(sign_for(honest, beat(honest, 3), 600))
    assert honest.public_hex in {v.sender_hex for v in net.get(Heartbeat, 3)}
