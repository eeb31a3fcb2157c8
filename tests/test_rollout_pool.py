"""The validator's rollout pool: honest batches go in; lying workers are refused, named and left out."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from node.events import Events
from node.learn.rl.checks import check_batch
from node.roles.rl.pool import EXAMINED_PER_BATCH, PENALTY_ROUNDS, UNSERVED_PENALTY_ROUNDS, PoolKeeper
from protocol import rollouts
from protocol.identity import Identity
from tests.rollouts import CFG, RUN, STATES, Workers, announced, honest_batch, lie_about_reward


def test_an_honest_batch_passes_every_check() -> None:
    worker = Identity.generate()
    batch = honest_batch(worker)
    a = announced(batch)
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
    a = announced(honest)
    assert callable(lie)
    bad = lie(honest)
    if bad.state_hash != honest.state_hash:  # a consistent lie: the announcement names the same state
        a = a.model_copy(update={"state_hash": bad.state_hash})
    problem = check_batch(bad, a, worker.public_hex, RUN, STATES, CFG)
    assert problem is not None and reason in problem


def test_a_batch_from_a_state_the_validator_never_had_is_refused() -> None:
    worker = Identity.generate()
    batch = honest_batch(worker, round_=2)
    a = announced(batch)
    assert "keeps no state" in (check_batch(batch, a, worker.public_hex, RUN, {3: STATES[3]}, CFG) or "")
    wrong = {2: STATES[3]}  # the validator's round-2 state is another one
    assert "state other than" in (check_batch(batch, a, worker.public_hex, RUN, wrong, CFG) or "")


def test_the_pool_takes_honest_batches_and_penalizes_liars(tmp_path: Path) -> None:
    honest, liar, garbler = Identity.generate(), Identity.generate(), Identity.generate()
    net = Workers(tmp_path)
    # every candidate is examined in one pass: under a busy test run fetching them can take longer
    # than CFG's 0.2 s, after which a pass that already has a batch stops examining
    patient = CFG.model_copy(update={"pool_wait_seconds": 30.0})
    keeper = PoolKeeper(net.validator, patient, RUN, Events("validator"))

    async def main() -> None:
        await net.publish(honest, honest_batch(honest))
        await net.publish(honest, honest_batch(honest, round_=2))
        await net.publish(liar, lie_about_reward(honest_batch(liar)))
        g = honest_batch(garbler)
        await net.publish(garbler, g, data=rollouts.encode(g) + b"\x00")  # announced truthfully, bytes are bad

        pool, groups = await keeper.build(3, STATES)
        assert [(e.worker, e.round) for e in pool.entries] == [(honest.public_hex, 3), (honest.public_hex, 2)]
        assert [len(g) for g in groups] == [CFG.prompts_per_batch] * 2
        refused = {r.worker: r.reason for r in pool.rejections}
        assert set(refused) == {liar.public_hex, garbler.public_hex}
        assert "claimed reward" in refused[liar.public_hex]
        assert "malformed" in refused[garbler.public_hex]
        assert keeper.penalized[liar.public_hex] == 3 + PENALTY_ROUNDS
        assert set(net.validator.held) == {e.blob_sha256 for e in pool.entries}
        # a worker whose batch passed has standing: the validator reads its announcements before a flood's
        assert net.validator.has_standing(honest.public_key)
        assert not any(net.validator.has_standing(k.public_key) for k in (liar, garbler))

        # next round the liar's honest batch is still left out: it is serving its penalty
        await net.publish(liar, honest_batch(liar))
        pool4, _ = await keeper.build(3, STATES)
        assert liar.public_hex not in {e.worker for e in pool4.entries}

    asyncio.run(main())


def test_candidates_come_in_an_order_the_workers_cannot_choose(tmp_path: Path) -> None:
    """Key order would let a key ground to sort first into every pool; the validator's secret order
    takes other workers in other rounds (and those with batches that passed before come first)."""
    workers = [Identity.from_seed(hashlib.sha256(f"worker/{i}".encode()).digest()) for i in range(12)]
    first_keys = set(sorted(w.public_hex for w in workers)[:2])
    states = {r: hashlib.sha256(f"w{r}".encode()).hexdigest() for r in range(2, 8)}
    cfg = CFG.model_copy(update={"pool_batches": 2, "max_staleness": 0})
    net = Workers(tmp_path)
    keeper = PoolKeeper(net.validator, cfg, RUN, Events("validator"))

    async def main() -> list[set[str]]:
        pools = []
        for r in range(3, 8):
            for w in workers:
                await net.publish(w, honest_batch(w, r, states))
            pool, _ = await keeper.build(r, states)
            pools.append({e.worker for e in pool.entries})
        return pools

    pools = asyncio.run(main())
    assert all(len(p) == 2 for p in pools)
    assert any(p != first_keys for p in pools), "every pool took the two keys that sort first"
    assert pools[1:] == [pools[0]] * 4  # once taken, a worker whose batches pass keeps its place


def test_announcements_nobody_serves_do_not_stall_the_pool(tmp_path: Path) -> None:
    """More announcements of unserved blobs than a pass may examine, then an honest worker's batch:
    each unserved one costs its key a penalty, the next pass has a fresh budget, and the pool is
    built with the honest batch (before, the budget of the whole pool was spent and `build` never
    returned)."""
    cfg = CFG.model_copy(update={"pool_batches": 2, "max_staleness": 0})
    net = Workers(tmp_path)
    keeper = PoolKeeper(net.validator, cfg, RUN, Events("validator"), poll=0.05)
    honest = Identity.generate()
    sybils = [Identity.generate() for _ in range(3 * EXAMINED_PER_BATCH * cfg.pool_batches)]

    async def main() -> list[str]:
        for sybil in sybils:  # announced, listed by nobody: no holder serves the blob
            peer = net.network.join(sybil, tmp_path / sybil.public_hex[:8], role="follower")
            await peer.publish(announced(honest_batch(sybil)))
        build = asyncio.ensure_future(keeper.build(3, STATES))
        await asyncio.sleep(0.3)  # the first passes spend their budgets on the flood
        await net.publish(honest, honest_batch(honest))
        pool, _ = await asyncio.wait_for(build, 20)
        return [e.worker for e in pool.entries]

    assert asyncio.run(main()) == [honest.public_hex]
    assert all(keeper.penalized[s.public_hex] == 3 + UNSERVED_PENALTY_ROUNDS for s in sybils)


def test_the_pool_closes_at_its_deadline_with_what_it_has(tmp_path: Path) -> None:
    """`min_pool_batches` not reached: past `pool_wait_seconds` the pool has the one batch it found."""
    cfg = CFG.model_copy(update={"pool_batches": 4, "min_pool_batches": 3, "pool_wait_seconds": 0.5})
    net = Workers(tmp_path)
    keeper = PoolKeeper(net.validator, cfg, RUN, Events("validator"), poll=0.05)
    honest = Identity.generate()

    async def main() -> int:
        await net.publish(honest, honest_batch(honest))
        pool, _ = await asyncio.wait_for(keeper.build(3, STATES), 10)
        return len(pool.entries)

    assert asyncio.run(main()) == 1
