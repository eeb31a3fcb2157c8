"""Whole rounds of the real roles in one process, on the in-memory network (`node/net/memory.py`).

Language modelling: a validator service, two miners and a follower run three rounds of a tiny GPT;
a second follower joins late (from the round-2 checkpoint) and a third starts from a state that is
not on the chain (it must rejoin). RL: the validator builds each round's rollout pool from two
inference workers (followers with a rollout service), and two GRPO miners train on it.

Records are signature-checked and blobs and submissions go through the transfer handlers as on
libp2p; the swarm tier proves the libp2p wiring itself.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from node.events import EventLog
from node.events.models import (
    Baseline,
    CheckpointAnnounced,
    CheckpointLoaded,
    PatchApplied,
    PoolPublished,
    RolloutsPublished,
    RoundClosed,
    Submitted,
)
from node.roles.catchup import Held
from node.roles.follower import Follower
from protocol.messages import Heartbeat, RoundResult
from tests.rounds import (
    POLL,
    TIMEOUT,
    Harness,
    MakeHarness,
    key,
    lm_manifest,
    rl_manifest,
)

ROUNDS = 3


async def play_lm(h: Harness) -> None:
    try:
        h.start_validator()
        work = [h.start_miner("miner0"), h.start_miner("miner1"), h.start_follower("follower")]
        await h.until("the checkpoint of round 2", lambda log: log.has(CheckpointAnnounced, "validator", 2))
        work.append(h.start_follower("late"))
        await asyncio.wait_for(asyncio.gather(*work), TIMEOUT)
        await followers_announce_what_they_hold(h)

        # a follower whose state is not the validator's round-1 state: the chain breaks at once
        me = key("stale")
        stale = Follower(h.network.join(me, h.root / "stale", role="follower"), h.events("stale", "follow"), poll=POLL)
        weights = {n: torch.zeros(1) for n in ("w",)}
        stale.chain.held = Held(1, weights, "0" * 64)
        await asyncio.wait_for(stale.run(ROUNDS), TIMEOUT)
    finally:
        await h.stop()


async def followers_announce_what_they_hold(h: Harness) -> None:
    """A follower's heartbeat lists the patches it applied, so fetchers can spread over it too."""
    me = key("follower").public_hex
    for r in range(1, ROUNDS):
        result = h.network.get(RoundResult, r - 1)[0].message
        beats = [v.message for v in h.network.get(Heartbeat, r) if v.sender_hex == me]
        assert beats and result.patch_sha256 in beats[0].blobs, f"round {r}: follower heartbeat {beats}"


async def play_rl(h: Harness) -> None:
    try:
        h.start_validator()
        work = [h.start_miner(f"miner{i}") for i in range(2)] + [h.start_follower(f"worker{i}") for i in range(2)]
        await asyncio.wait_for(asyncio.gather(*work), TIMEOUT)
    finally:
        await h.stop()


@pytest.fixture(scope="module")
def lm_run(round_harness: MakeHarness) -> EventLog:
    h = round_harness("in-process", lm_manifest())
    asyncio.run(play_lm(h))
    return h.log()


@pytest.fixture(scope="module")
def rl_run(round_harness: MakeHarness, tmp_path_factory: pytest.TempPathFactory) -> EventLog:
    with pytest.MonkeyPatch.context() as mp:
        # the warm start is cached here, not in ~/.cache
        mp.setenv("PULSE_CACHE_DIR", str(tmp_path_factory.mktemp("rl-cache")))
        h = round_harness("in-process-rl", rl_manifest())
        asyncio.run(play_rl(h))
    return h.log()


def one_outcome_each(log: EventLog, miners: list[str]) -> None:
    """Every submission a validator took is aggregated or rejected with a reason in its round, never both."""
    closed = {e.round: e for e in log.events(RoundClosed, "validator")}
    keys = log.keys()
    for name in miners:
        for sent in log.events(Submitted, name):
            outcome = closed[sent.round]
            assert (keys[name] in outcome.scores) != (keys[name] in outcome.rejections), (name, sent.round)


def test_every_round_aggregates_submissions(lm_run: EventLog) -> None:
    closed = lm_run.events(RoundClosed, "validator")
    assert [e.round for e in closed] == list(range(ROUNDS))
    assert all(e.loss is not None for e in closed)
    # with two miners the own-data indicator can turn both down in a round (it depends on their data)
    assert sum(e.selected >= 1 for e in closed) >= ROUNDS - 1
    one_outcome_each(lm_run, ["miner0", "miner1"])
    miners = {lm_run.keys()["miner0"], lm_run.keys()["miner1"]}
    assert {k for e in closed for k in e.scores} <= miners


def test_every_node_ends_on_the_validators_state(lm_run: EventLog) -> None:
    finals = lm_run.final_hashes()
    assert set(finals) == {"validator", "miner0", "miner1", "follower", "late", "stale"}
    assert len(set(finals.values())) == 1
    assert finals["validator"] == lm_run.events(RoundClosed, "validator")[-1].state_hash


def test_a_late_follower_catches_up_from_the_latest_checkpoint(lm_run: EventLog) -> None:
    assert [e.round for e in lm_run.events(CheckpointLoaded, "late")] == [2]
    assert [e.round for e in lm_run.events(PatchApplied, "late")] == [2]  # then only the chain from there
    assert [e.round for e in lm_run.events(PatchApplied, "follower")] == list(range(ROUNDS))


def test_a_broken_chain_rejoins_from_a_checkpoint(lm_run: EventLog) -> None:
    assert [e.round for e in lm_run.events(CheckpointLoaded, "stale")] == [2]
    assert lm_run.final_hashes()["stale"] == lm_run.final_hashes()["validator"]


def test_an_rl_run_pools_rollouts_and_stays_in_step(rl_run: EventLog) -> None:
    closed = rl_run.events(RoundClosed, "validator")
    assert [e.round for e in closed] == list(range(ROUNDS))
    assert all(e.reward is not None for e in closed) and rl_run.events(Baseline, "validator")[0].reward is not None
    workers = {rl_run.keys()["worker0"], rl_run.keys()["worker1"]}
    pools = rl_run.events(PoolPublished, "validator")
    assert [p.round for p in pools] == list(range(ROUNDS))
    assert all(p.batches >= 2 and set(p.workers) <= workers and not p.refused for p in pools)
    assert {r.name for r in rl_run.of(RolloutsPublished)} == {"worker0", "worker1"}
    assert all(e.pushed for e in rl_run.events(RolloutsPublished))  # the validator took each over a stream
    assert rl_run.events(Submitted, "miner0") and rl_run.events(Submitted, "miner1")
    one_outcome_each(rl_run, ["miner0", "miner1"])
    finals = rl_run.final_hashes()
    assert set(finals) == {"validator", "miner0", "miner1", "worker0", "worker1"}
    assert len(set(finals.values())) == 1
