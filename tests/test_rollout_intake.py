"""Rollout batches pushed to the validator: seated by standing and ticket, examined before open DHT
announcements, bounded per round, and a key that pushes another's batch cannot keep it out."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import pytest

from node.net.blobstore import BlobStore
from node.net.streams import DEFAULT_LIMITS, Status, Stream, TransferLimits, read_reply, send_request
from node.net.transfer import SUBMIT, Handlers
from node.roles.rl.intake import rollout_rules
from node.roles.rl.pool import PENALTY_ROUNDS
from protocol import rollouts
from protocol.errors import TransferError
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.rollouts import RolloutBatch
from protocol.signing import sign
from tests.rollouts import (
    CFG,
    RUN,
    STATES,
    VALIDATOR,
    Workers,
    announced,
    honest_batch,
    lie_about_reward,
    pushed_keeper,
)

ROUNDS = {r: hashlib.sha256(f"w{r}".encode()).hexdigest() for r in range(2, 6)}


def test_a_pushed_batch_enters_the_pool_with_no_dht_record(tmp_path: Path) -> None:
    net = Workers(tmp_path)
    keeper = pushed_keeper(net)
    honest = Identity.generate()
    batch = honest_batch(honest)

    async def main() -> None:
        await net.push(honest, batch)  # no heartbeat lists it, no announcement names it
        pool, groups = await asyncio.wait_for(keeper.build(3, STATES), 10)
        assert [(e.worker, e.round) for e in pool.entries] == [(honest.public_hex, 3)]
        assert len(groups[0]) == CFG.prompts_per_batch
        sha = pool.entries[0].blob_sha256
        # the validator serves it to miners from its own store, and announces it in its heartbeats
        assert net.validator.store.has(sha) and sha in net.validator.held
        assert net.validator.has_standing(honest.public_key)

    asyncio.run(main())


def test_a_flood_of_fresh_pushers_cannot_take_the_seat_of_a_worker_with_standing(tmp_path: Path) -> None:
    """Round 3: an honest worker's batch passes. Round 4: 60 fresh keys push first (lying batches) and
    hold every seat, then the honest worker comes: it unseats a newcomer (no newcomer can take its
    seat), so its batch is in the pool; the round never holds more batches than its seats, and the
    liars that were examined are refused."""
    cfg = CFG.model_copy(update={"pool_batches": 2, "max_staleness": 0})
    seats = rollout_rules(cfg).capacity
    net = Workers(tmp_path)
    keeper = pushed_keeper(net, cfg)
    honest = Identity.generate()
    flood = [Identity.generate() for _ in range(60)]

    async def main() -> list[str]:
        await net.push(honest, honest_batch(honest, 3, ROUNDS))
        await asyncio.wait_for(keeper.build(3, ROUNDS), 10)
        assert keeper.intake is not None
        refused = 0
        for sybil in flood:
            try:
                await net.push(sybil, lie_about_reward(honest_batch(sybil, 4, ROUNDS)))
            except TransferError as exc:
                assert "not drawn" in str(exc)
                refused += 1
        assert refused > 0 and len(keeper.intake.held(4)) == seats  # the flood fills every seat it may
        await net.push(honest, honest_batch(honest, 4, ROUNDS))
        held = keeper.intake.held(4)
        assert honest.public_hex in {v.sender_hex for v, _ in held} and len(held) <= seats
        on_disk = {path.name for r in (3, 4) for _, path in keeper.intake.held(r)}
        assert set(keeper.intake.inbox) == on_disk  # an unseated newcomer's bytes are gone
        pool, _ = await asyncio.wait_for(keeper.build(4, ROUNDS), 10)
        assert all(r.worker != honest.public_hex for r in pool.rejections)
        assert {r.worker for r in pool.rejections} <= {s.public_hex for s in flood}
        return [e.worker for e in pool.entries]

    assert asyncio.run(main()) == [honest.public_hex]


def test_a_flood_of_unserved_announcements_costs_a_pushed_batch_nothing(tmp_path: Path) -> None:
    """Three passes' worth of announcements naming blobs nobody serves, and one pushed batch: the
    pool takes the pushed one in its first pass and fetches none of the flood's."""
    cfg = CFG.model_copy(update={"pool_batches": 1, "max_staleness": 0, "pool_wait_seconds": 5.0})
    net = Workers(tmp_path)
    keeper = pushed_keeper(net, cfg, poll=0.05)
    honest = Identity.generate()

    async def main() -> tuple[list[str], float]:
        for _ in range(3 * 4 * cfg.pool_batches):
            sybil = Identity.generate()
            peer = net.network.join(sybil, tmp_path / sybil.public_hex[:8], role="follower")
            await peer.publish(announced(honest_batch(sybil)))
        await net.push(honest, honest_batch(honest))
        start = time.monotonic()
        pool, _ = await asyncio.wait_for(keeper.build(3, STATES), 20)
        return [e.worker for e in pool.entries], time.monotonic() - start

    workers, seconds = asyncio.run(main())
    assert workers == [honest.public_hex]
    assert not keeper.penalized, "the flood's blobs were fetched"
    assert seconds < cfg.pool_wait_seconds


def test_a_key_that_pushes_anothers_batch_is_refused_and_the_owner_still_taken(tmp_path: Path) -> None:
    """A thief pushes the bytes of an honest worker's announced batch (they name their worker) before
    the validator looks at the announcement: the thief is refused, the honest batch is examined and
    taken all the same. A second thief announcing the same blob a round later is refused as a copy."""
    net = Workers(tmp_path)
    keeper = pushed_keeper(net)
    honest, thief, copier = Identity.generate(), Identity.generate(), Identity.generate()
    batch = honest_batch(honest)
    data = rollouts.encode(batch)

    async def main() -> None:
        await net.publish(honest, batch)
        await net.push(thief, batch, data)  # pushed: examined before any announcement
        pool, _ = await asyncio.wait_for(keeper.build(3, STATES), 10)
        assert [e.worker for e in pool.entries] == [honest.public_hex]
        refused = {r.worker: r.reason for r in pool.rejections}
        assert set(refused) == {thief.public_hex} and "another run, round or worker" in refused[thief.public_hex]

        copy = announced(batch)  # the honest blob, announced under the copier's key
        await net.peer(copier).publish(copy)
        pool4, _ = await asyncio.wait_for(keeper.build(4, {**STATES, 4: ROUNDS[4]}), 10)
        assert [e.worker for e in pool4.entries] == [honest.public_hex]
        assert "a copy of worker" in {r.worker: r.reason for r in pool4.rejections}[copier.public_hex]

    asyncio.run(main())


def test_rounds_outside_the_window_are_refused_before_their_bytes_and_old_rounds_leave_the_inbox(
    tmp_path: Path,
) -> None:
    net = Workers(tmp_path)
    keeper = pushed_keeper(net, opened=3)  # max_staleness 1: rounds 2 to 4
    worker = Identity.generate()
    assert keeper.intake is not None
    intake = keeper.intake

    async def main() -> None:
        with pytest.raises(TransferError, match="rollouts of round 5 are not taken now"):
            await net.push(worker, honest_batch(worker, 5, ROUNDS))
        assert not list(intake.inbox) and not intake.inbox.partial_files()
        await net.push(worker, honest_batch(worker, 2, ROUNDS))
        (pushed,) = intake.held(2)
        assert intake.inbox.has(pushed[1].name)
        intake.open(4)  # rounds 3 to 5 now
        assert intake.held(2) == [] and not intake.inbox.has(pushed[1].name)
        await net.push(worker, honest_batch(worker, 5, ROUNDS))
        with pytest.raises(TransferError, match="one submission per miner per round"):
            await net.push(worker, lie_about_reward(honest_batch(worker, 5, ROUNDS)))  # one batch a round

    asyncio.run(main())


def test_a_validator_without_a_pool_refuses_rollout_pushes_before_their_bytes(tmp_path: Path) -> None:
    """An LM validator (an intake for submissions, no pool) and a follower (neither) refuse a
    worker's push with the reason, and nothing lands on their disks."""
    net = Workers(tmp_path)
    inbox = net.network.join(VALIDATOR, tmp_path / "lm", role="validator").store
    lm = net.network.join(
        VALIDATOR,
        tmp_path / "lm-validator",
        role="validator",
        intake=Handlers(inbox, accept=lambda header: None, on_submission=lambda verified, path: None),
    )
    follower = net.network.join(Identity.generate(), tmp_path / "follower", role="follower")
    worker = Identity.generate()
    peer = net.peer(worker)
    data = rollouts.encode(honest_batch(worker))
    sha = peer.store.put(data)
    signed = peer.sign(announced(honest_batch(worker)))

    async def main() -> None:
        with pytest.raises(TransferError, match="takes no rollout batches"):
            await peer.submit(signed, peer.store.path(sha), to=lm.peer_id)
        with pytest.raises(TransferError, match="takes no submissions"):
            await peer.submit(signed, peer.store.path(sha), to=follower.peer_id)

    asyncio.run(main())
    assert not list(inbox) and not list(follower.store)


def test_a_worker_caught_lying_loses_its_seat_and_its_pushes_are_refused_before_their_bytes(tmp_path: Path) -> None:
    """Standing from a passed batch does not outlive a lie: the liar is no longer favoured nor
    seated before newcomers, and while its penalty lasts its pushes are refused on the header."""
    cfg = CFG.model_copy(update={"max_staleness": 0})
    net = Workers(tmp_path)
    keeper = pushed_keeper(net, cfg)
    assert keeper.intake is not None
    worker, other = Identity.generate(), Identity.generate()

    async def main() -> None:
        await net.push(worker, honest_batch(worker, 3, ROUNDS))
        await asyncio.wait_for(keeper.build(3, ROUNDS), 10)
        assert keeper.intake is not None and keeper.intake.favoured(worker.public_hex)
        await net.push(other, honest_batch(other, 4, ROUNDS))  # a pool needs one batch to close
        await net.push(worker, lie_about_reward(honest_batch(worker, 4, ROUNDS)))
        pool, _ = await asyncio.wait_for(keeper.build(4, ROUNDS), 10)
        assert "claimed reward" in {r.worker: r.reason for r in pool.rejections}[worker.public_hex]
        assert not keeper.intake.favoured(worker.public_hex)
        with pytest.raises(TransferError, match="left out of rollout pools until round 14"):
            await net.push(worker, honest_batch(worker, 5, ROUNDS))
        assert keeper.intake.held(5) == []

    asyncio.run(main())


def test_a_restarted_validator_reads_standing_and_penalties_back_from_its_published_pools(tmp_path: Path) -> None:
    """Round 3's pool took an honest worker and refused a liar. A validator restarted at round 4
    (a new keeper, nothing in memory) still favours the honest worker and seats it before
    newcomers, and refuses the liar's pushes on the header."""
    net = Workers(tmp_path)
    first = pushed_keeper(net)
    honest, liar, other = Identity.generate(), Identity.generate(), Identity.generate()

    async def main() -> None:
        await net.push(honest, honest_batch(honest, 3, ROUNDS))
        await net.push(liar, lie_about_reward(honest_batch(liar, 3, ROUNDS)))
        pool, _ = await asyncio.wait_for(first.build(3, ROUNDS), 10)
        await net.validator.publish(pool)

        restarted = pushed_keeper(net, opened=4)
        assert restarted.intake is not None and not restarted.intake.favoured(honest.public_hex)
        await net.push(other, honest_batch(other, 4, ROUNDS))
        await asyncio.wait_for(restarted.build(4, ROUNDS), 10)
        assert restarted.intake.favoured(honest.public_hex) and restarted.trusted[honest.public_hex] == 3
        assert restarted.penalized[liar.public_hex] == 3 + PENALTY_ROUNDS
        with pytest.raises(TransferError, match="left out of rollout pools"):
            await net.push(liar, honest_batch(liar, 5, ROUNDS))

    asyncio.run(main())


async def trickle_rollouts(stream: Stream, worker: Identity, batch: RolloutBatch, pause: float) -> Status:
    """Push `batch` under `worker`'s signed announcement a byte per `pause` seconds; the first answer."""
    reader, writer = stream
    await send_request(writer, sign(worker, announced(batch)).to_bytes(), DEFAULT_LIMITS)
    status, _, _ = await read_reply(reader, 5)
    if status is Status.OK:
        for byte in rollouts.encode(batch):
            writer.write(bytes([byte]))
            await asyncio.sleep(pause)
    return status


def test_rollout_pushes_take_slots_of_their_own(tmp_path: Path) -> None:
    """Fresh keys trickling rollout batches hold the open rollout slot (one more is BUSY), yet a
    miner's submission goes through (its slots are apart) and a worker with standing takes the
    reserved rollout slot."""
    inbox = BlobStore(tmp_path / "submissions")
    taken: list[str] = []
    intake = Handlers(inbox, accept=lambda h: None, on_submission=lambda v, p: taken.append(v.message.sender))
    net = Workers(tmp_path, TransferLimits(max_rollout_streams=2, reserved_rollout_streams=1), intake)
    keeper = pushed_keeper(net)
    trusted = Identity.generate()
    miner = net.network.join(Identity.generate(), tmp_path / "miner", role="miner")

    async def main() -> list[Status]:
        await net.push(trusted, honest_batch(trusted, 3, ROUNDS))
        await asyncio.wait_for(keeper.build(3, ROUNDS), 10)  # it has standing now
        streams = [net.network.open(f"Sybil{i}", net.validator.peer_id, SUBMIT) for i in range(2)]
        async with streams[0] as first, streams[1] as second:
            flood = [
                asyncio.ensure_future(trickle_rollouts(s, w, honest_batch(w, 4, ROUNDS), 0.05))
                for s, w in ((first, Identity.generate()), (second, Identity.generate()))
            ]
            await asyncio.sleep(0.3)
            answers = [f.result() for f in flood if f.done()]
            data = b"update" * 100
            signed = miner.sign(SubmissionHeader.for_payload(
                run_id=RUN, round_=3, base_hash="0" * 64, payload=data, codec="dense", data_digest="0" * 64,
                sender=miner.identity.public_hex,
            ))  # fmt: skip
            await miner.submit(signed, miner.store.path(miner.store.put(data)), to=net.validator.peer_id)
            await net.push(trusted, honest_batch(trusted, 4, ROUNDS))  # the reserved slot
            for f in flood:
                f.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
        return answers

    answers = asyncio.run(main())
    assert answers == [Status.BUSY]  # one fresh key holds the open rollout slot, the other is turned away
    assert taken == [miner.identity.public_hex]
    assert keeper.intake is not None and trusted.public_hex in {v.sender_hex for v, _ in keeper.intake.held(4)}


def test_a_pushed_batch_unseated_while_the_pool_is_built_is_passed_over(tmp_path: Path) -> None:
    """The pool lists the held batches, then examines them one by one; pushes keep arriving meanwhile,
    and one that unseats a listed batch removes its bytes. The pool passes over it (neither taken
    nor refused: not its worker's fault) and is built from the rest. Before, reading the removed
    file raised out of the pool and stopped the validator (`pulse bench attacks`, rl-push-flood)."""
    net = Workers(tmp_path)
    keeper = pushed_keeper(net)
    assert keeper.intake is not None
    intake, first, second = keeper.intake, Identity.generate(), Identity.generate()
    listed = keeper._candidates

    async def unseat_after_listing(round_: int) -> list[tuple[object, Path | None]]:
        found = await listed(round_)
        verified, path = found[0]
        intake._drop(verified.message.round, verified.sender_hex, "unseated by a newcomer with a lower ticket")
        assert path is not None and not path.exists()
        return found  # type: ignore[return-value]

    keeper._candidates = unseat_after_listing  # type: ignore[assignment,method-assign]

    async def main() -> None:
        await net.push(first, honest_batch(first))
        await net.push(second, honest_batch(second))
        pool, _ = await asyncio.wait_for(keeper.build(3, STATES), 10)
        assert len(pool.entries) == 1 and not pool.rejections

    asyncio.run(main())
