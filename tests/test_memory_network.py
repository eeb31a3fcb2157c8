"""The in-memory network keeps the rules of the real one: records are checked as DHT peers check
them, blobs are hash-checked, and only a peer that takes submissions accepts a push."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from pathlib import Path

import pytest

from node.net.blobstore import BlobStore
from node.net.dht import sign_for
from node.net.memory import MemoryNetwork, MemoryPeer
from node.net.peer import RunRecords
from node.net.transfer import Handlers
from protocol.errors import TransferError
from protocol.identity import Identity
from protocol.messages import Heartbeat, SubmissionHeader
from protocol.signing import Verified, sign

RUN = hashlib.sha256(b"pulse-test-memory-network").hexdigest()
VALIDATOR = Identity.generate()


def network(run_id: str = RUN, ttl: float = 3600.0) -> MemoryNetwork:
    return MemoryNetwork(RunRecords(run_id, (VALIDATOR.public_hex,), ttl, 5))


def beat(peer: MemoryPeer, round_: int = 1) -> Heartbeat:
    return Heartbeat(
        run_id=peer.run_id, round=round_, role=peer.role, peer_id=peer.peer_id, state_hash=None, blobs=(), sent_at=1
    )


def test_records_are_checked_as_a_dht_peer_checks_them(tmp_path: Path) -> None:
    net = network()
    peer = net.join(Identity.generate(), tmp_path / "a", role="miner")
    signed = sign_for(peer.identity, beat(peer), 60)
    assert net.store(signed)
    forged = dataclasses.replace(signed, signature=bytes([signed.signature[0] ^ 1]) + signed.signature[1:])
    assert not net.store(forged)  # the signature does not verify
    other = network(hashlib.sha256(b"another run").hexdigest())
    assert not other.store(signed)  # signed for another run
    far = int((time.time() + 10 * 86_400) * 1000)
    assert not net.store(sign(peer.identity, beat(peer, 2), expires_ms=far))  # an expiry beyond the record TTL cap
    assert not net.store(sign(peer.identity, beat(peer, 3)))  # signed without an expiry: not a DHT record

    found: list[Verified[Heartbeat]] = asyncio.run(peer.get(Heartbeat, 1))
    assert [v.sender_hex for v in found] == [peer.identity.public_hex]
    # a round result counts only when one of the run's validators signed it
    assert asyncio.run(peer.round_result(1)) is None


def test_expired_records_are_gone(tmp_path: Path) -> None:
    net = network(ttl=0.01)
    peer = net.join(Identity.generate(), tmp_path / "a", role="miner")

    async def main() -> list[Verified[Heartbeat]]:
        await peer.publish(beat(peer))
        await asyncio.sleep(0.05)
        return await peer.get(Heartbeat, 1)

    assert asyncio.run(main()) == []


def test_blobs_come_from_a_holder_and_are_hash_checked(tmp_path: Path) -> None:
    net = network()
    holder = net.join(Identity.generate(), tmp_path / "holder", role="follower")
    reader = net.join(Identity.generate(), tmp_path / "reader", role="follower")
    data = b"pulse blob" * 100
    sha = holder.store.put(data)

    async def main() -> bytes:
        with pytest.raises(TransferError):  # nobody lists it yet
            await reader.fetch(sha, len(data), 1)
        holder.hold(sha, 1)
        await holder.heartbeat(1, None)
        with pytest.raises(TransferError):  # the holder refuses more than the announced size
            await reader.fetch(sha, len(data) - 1, 1)
        return (await reader.fetch(sha, len(data), 1)).read_bytes()

    assert asyncio.run(main()) == data
    assert not reader.store.partial_files()


def test_only_a_peer_that_takes_submissions_accepts_a_push(tmp_path: Path) -> None:
    net = network()
    miner = net.join(Identity.generate(), tmp_path / "miner", role="miner")
    silent = net.join(VALIDATOR, tmp_path / "silent", role="validator")  # built without an intake
    got: list[Verified[SubmissionHeader]] = []
    inbox = BlobStore(tmp_path / "validator" / "inbox")

    def take(verified: Verified[SubmissionHeader], path: Path) -> str | None:
        got.append(verified)
        return None

    intake = Handlers(inbox, accept=lambda header: None, on_submission=take)
    validator = net.join(VALIDATOR, tmp_path / "validator", role="validator", intake=intake)
    payload = b"payload" * 10
    path = miner.store.path(miner.store.put(payload))
    header = SubmissionHeader.for_payload(
        run_id=RUN, round_=0, base_hash="0" * 64, payload=payload, codec="dense", data_digest="0" * 64,
        sender=miner.identity.public_hex,
    )  # fmt: skip

    async def main() -> None:
        await silent.heartbeat(0, None)
        assert await miner.validator_heartbeat(0) is not None
        with pytest.raises(TransferError, match="takes no submissions"):
            await miner.submit(sign(miner.identity, header), path, to=silent.peer_id)
        await miner.submit(sign(miner.identity, header), path, to=validator.peer_id)

    asyncio.run(main())
    assert [v.message for v in got] == [header]
    assert inbox.read(header.payload_sha256) == payload  # in the intake's inbox, apart from the served blobs
    assert not validator.store.has(header.payload_sha256)
