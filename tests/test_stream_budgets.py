"""Streams that fresh peers open for free must not stall a node: silent and trickling streams,
floods of uploads, fake blob holders, pushes to nodes that take none, and peer-chosen text in logs.

Everything runs on the in-memory network (`node/net/memory.py`), which serves streams with the
same `TransferService` as libp2p peers; `tests/swarm/` plays the same attacks on real daemons.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from node.net.blobstore import BlobStore
from node.net.memory import MemoryNetwork, MemoryPeer
from node.net.peer import RunRecords
from node.net.streams import DEFAULT_LIMITS, Status, Stream, TransferLimits, read_reply, reply, send_file, send_request
from node.net.transfer import SUBMIT, Handlers, TransferService, fetch_request
from protocol.errors import PeerBusy, TransferError, TransferTimeout
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.signing import SignedMessage, Verified, sign

RUN = hashlib.sha256(b"pulse-test-stream-budgets").hexdigest()
VALIDATOR = Identity.generate()


def network(limits: TransferLimits = DEFAULT_LIMITS) -> MemoryNetwork:
    return MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5), limits)


def header(me: Identity, payload: bytes) -> SubmissionHeader:
    return SubmissionHeader.for_payload(
        run_id=RUN, round_=0, base_hash="0" * 64, payload=payload, codec="dense", data_digest="0" * 64,
        sender=me.public_hex,
    )  # fmt: skip


def payload_file(peer: MemoryPeer, data: bytes) -> Path:
    return peer.store.path(peer.store.put(data))


async def open_validator(
    net: MemoryNetwork, tmp_path: Path, favoured: Callable[[SubmissionHeader], bool] = lambda h: False
) -> tuple[MemoryPeer, list[Verified[SubmissionHeader]]]:
    """A validator that takes every push (`favoured` senders may use the reserved slots), its heartbeat
    published (so miners know its peer id)."""
    got: list[Verified[SubmissionHeader]] = []

    def take(verified: Verified[SubmissionHeader], path: Path) -> None:
        got.append(verified)

    intake = Handlers(BlobStore(tmp_path / "inbox"), lambda h: None, take, favoured)
    validator = net.join(VALIDATOR, tmp_path / "validator", role="validator", intake=intake)
    await validator.heartbeat(0, None)
    return validator, got


@asynccontextmanager
async def held_open(net: MemoryNetwork, target: str, name: str, n: int) -> AsyncIterator[list[Stream]]:
    """`n` streams from fresh peer ids to `target`'s handler, held open while the block runs."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(net.open(f"Sybil{i}", target, name)) for i in range(n)]


async def trickle_upload(stream: Stream, me: Identity, data: bytes, pause: float) -> Status:
    """Push `data` under `me`'s signed header one byte per `pause` seconds; the validator's first answer."""
    reader, writer = stream
    await send_request(writer, sign(me, header(me, data)).to_bytes(), DEFAULT_LIMITS)
    status, _, _ = await read_reply(reader, 5)
    if status is Status.OK:
        for byte in data:
            writer.write(bytes([byte]))
            await asyncio.sleep(pause)
    return status


# -- item 3: stream slots ------------------------------------------------------------------------


def test_silent_streams_do_not_block_a_miners_push(tmp_path: Path) -> None:
    """20 streams that never send a request (more than the 16 slots there once were for everything)."""
    net = network()

    async def main() -> None:
        validator, got = await open_validator(net, tmp_path)
        miner = net.join(Identity.generate(), tmp_path / "miner", role="miner")
        await miner.validator_heartbeat(0)
        data = b"honest" * 100
        async with held_open(net, validator.peer_id, SUBMIT, 20):
            await asyncio.wait_for(
                miner.submit(sign(miner.identity, header(miner.identity, data)), payload_file(miner, data)), 10
            )
        assert [v.message.sender for v in got] == [miner.identity.public_hex]

    asyncio.run(main())


def test_a_flood_of_silent_streams_costs_a_miner_a_retry_not_its_round(tmp_path: Path) -> None:
    """More silent streams than request slots: the miner is answered BUSY, retries, and gets in once
    the silent ones have been dropped at `request_timeout`."""
    net = network(TransferLimits(request_timeout=0.5, max_requests=8))

    async def main() -> float:
        validator, got = await open_validator(net, tmp_path)
        miner = net.join(Identity.generate(), tmp_path / "miner", role="miner")
        await miner.validator_heartbeat(0)
        data = b"honest" * 100
        signed, path = sign(miner.identity, header(miner.identity, data)), payload_file(miner, data)
        started = time.monotonic()
        async with held_open(net, validator.peer_id, SUBMIT, 12):
            with pytest.raises(PeerBusy):  # without a deadline, BUSY is final
                await miner.submit(signed, path)
            await miner.submit(signed, path, deadline=time.time() + 10)
        assert len(got) == 1
        return time.monotonic() - started

    assert asyncio.run(main()) < 5.0


def test_a_flood_of_uploads_does_not_block_fetches(tmp_path: Path) -> None:
    """16 fresh keys trickle uploads at the validator; a follower still fetches the patch from it."""
    net = network()

    async def main() -> bytes:
        validator, _ = await open_validator(net, tmp_path)
        patch = b"patch" * 1000
        validator.hold(validator.store.put(patch), 0)
        await validator.heartbeat(0, None)
        follower = net.join(Identity.generate(), tmp_path / "follower", role="follower")
        async with held_open(net, validator.peer_id, SUBMIT, 16) as streams:
            uploads = [
                asyncio.ensure_future(trickle_upload(s, Identity.generate(), b"junk" * 100, 0.5)) for s in streams
            ]
            await asyncio.sleep(0.2)
            fetched = await asyncio.wait_for(follower.fetch(hashlib.sha256(patch).hexdigest(), len(patch), 0), 10)
            for upload in uploads:
                upload.cancel()
            await asyncio.gather(*uploads, return_exceptions=True)
        return fetched.read_bytes()

    assert asyncio.run(main()) == b"patch" * 1000


def test_uploads_have_their_own_budget_with_slots_kept_for_favoured_senders(tmp_path: Path) -> None:
    net = network(TransferLimits(max_submit_streams=2, reserved_submit_streams=1))
    rated = Identity.generate()

    async def main() -> list[Status]:
        validator, _ = await open_validator(net, tmp_path, lambda h: h.sender == rated.public_hex)
        async with held_open(net, validator.peer_id, SUBMIT, 3) as streams:
            fresh = [asyncio.ensure_future(trickle_upload(s, Identity.generate(), b"x" * 50, 0.2)) for s in streams[:2]]
            await asyncio.sleep(0.2)
            kept = asyncio.ensure_future(trickle_upload(streams[2], rated, b"y" * 50, 0.01))
            await asyncio.sleep(0.2)
            statuses = [f.result() for f in fresh if f.done()]
            await kept
            for f in fresh:
                f.cancel()
            await asyncio.gather(*fresh, return_exceptions=True)
            return [*statuses, kept.result()]

    # one fresh key took the open slot, the other was BUSY; the rated miner took the reserved one
    assert asyncio.run(main()) == [Status.BUSY, Status.OK]


def test_a_busy_validator_is_asked_again_until_the_deadline(tmp_path: Path) -> None:
    net = network(TransferLimits(max_submit_streams=1, reserved_submit_streams=0))

    async def main() -> None:
        validator, got = await open_validator(net, tmp_path)
        miner = net.join(Identity.generate(), tmp_path / "miner", role="miner")
        await miner.validator_heartbeat(0)
        data = b"honest" * 10
        signed, path = sign(miner.identity, header(miner.identity, data)), payload_file(miner, data)
        async with held_open(net, validator.peer_id, SUBMIT, 1) as (stream,):
            slow = asyncio.ensure_future(trickle_upload(stream, Identity.generate(), b"z" * 10, 0.1))
            await asyncio.sleep(0.1)
            with pytest.raises(PeerBusy):
                await miner.submit(signed, path, deadline=time.time() + 0.3)  # too close: BUSY is the answer
            await miner.submit(signed, path, deadline=time.time() + 15)  # the slot frees after ~1 s
            await slow
        assert miner.identity.public_hex in {v.message.sender for v in got} and len(got) == 2

    asyncio.run(main())


class SlowWriter:
    """A reader on the other end that takes one batch per second (4 KiB/s here)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        await asyncio.sleep(1.0)


def test_a_slow_reader_cannot_hold_a_fetch_slot(tmp_path: Path) -> None:
    """The blob must be taken at the minimum rate too, not only arrive at it."""
    store = BlobStore(tmp_path)
    sha = store.put(bytes(16 << 10))
    # each drain is well within chunk_timeout, but 16 KiB at 4 KiB/s is under the 8 KiB/s minimum
    limits = TransferLimits(open_timeout=0.2, chunk_timeout=5.0, min_bytes_per_second=8192, batch_bytes=4096)

    async def main() -> float:
        started = time.monotonic()
        with pytest.raises(TransferTimeout, match="too slow"):
            await send_file(SlowWriter(), store.path(sha), 16 << 10, limits)  # type: ignore[arg-type]
        return time.monotonic() - started

    assert asyncio.run(main()) < 3.0  # cut at 0.2 s + 16 KiB / 8 KiB/s, not after the 4 s the reader needs


# -- item 10: fetching from claimed holders -----------------------------------------------------


def silent(peer: MemoryPeer) -> None:
    """`peer` claims blobs but answers no fetch: it takes the stream and says nothing."""

    async def rpc_fetch(info: Any, reader: asyncio.StreamReader, writer: Any) -> None:
        await asyncio.sleep(3600)

    peer.service.rpc_fetch = rpc_fetch  # type: ignore[method-assign]


def test_fake_holders_cost_a_fetch_seconds_and_are_remembered(tmp_path: Path) -> None:
    net = network()

    async def main() -> tuple[float, float]:
        blobs = [b"patch one" * 500, b"patch two" * 500]
        shas = [hashlib.sha256(b).hexdigest() for b in blobs]
        fakes = [net.join(Identity.generate(), tmp_path / f"fake{i}", role="follower") for i in range(5)]
        honest = net.join(Identity.generate(), tmp_path / "honest", role="follower")
        for peer in (*fakes, honest):
            for sha, data in zip(shas, blobs, strict=True):
                if peer is honest:
                    peer.store.put(data)
                peer.held.append(sha)
            await peer.heartbeat(1, None)
        for fake in fakes:
            silent(fake)
        reader = net.join(Identity.generate(), tmp_path / "reader", role="follower")
        started = time.monotonic()
        await asyncio.wait_for(reader.fetch(shas[0], len(blobs[0]), 1), 30)
        first = time.monotonic() - started
        started = time.monotonic()
        await asyncio.wait_for(reader.fetch(shas[1], len(blobs[1]), 1), 30)
        return first, time.monotonic() - started

    first, second = asyncio.run(main())
    assert first < 15.0  # one after another, 5 silent holders would cost up to 5 x 20 s
    assert second < 1.0  # the holder that delivered is asked first


# -- item 6: only a validator takes pushes --------------------------------------------------------


@pytest.mark.parametrize("role", ["miner", "follower"])
def test_a_push_to_a_miner_or_follower_is_refused_before_its_body(tmp_path: Path, role: str) -> None:
    net = network()

    async def main() -> tuple[Status, str]:
        target = net.join(Identity.generate(), tmp_path / "target", role=role)  # type: ignore[arg-type]
        me = Identity.generate()
        async with net.open("Pusher", target.peer_id, SUBMIT) as (reader, writer):
            await send_request(writer, sign(me, header(me, b"free hosting" * 100)).to_bytes(), DEFAULT_LIMITS)
            status, _, reason = await read_reply(reader, 5)
            return status, reason

    status, reason = asyncio.run(main())
    assert (status, reason) == (Status.REJECTED, "this node takes no submissions")


def test_a_blob_service_takes_no_push_unless_a_role_opts_in(tmp_path: Path) -> None:
    """The class of the problem: any `TransferService` refuses pushes until given an `accept`
    (every node serves blobs; only the validator's role hands it one)."""
    store = BlobStore(tmp_path / "store")
    service = TransferService(None, store, run_id=RUN)
    me, data = Identity.generate(), b"free hosting" * 100
    request = sign(me, header(me, data)).to_bytes()

    async def main() -> bytes:
        reader, writer = asyncio.StreamReader(), Recorder()
        reader.feed_data(len(request).to_bytes(4, "big") + request + data)
        reader.feed_eof()
        await service.rpc_submit(Named("Pusher"), reader, writer)  # type: ignore[arg-type]
        return bytes(writer.data)

    answer = asyncio.run(main())
    assert answer[0] == Status.REJECTED and b"takes no submissions" in answer
    assert list(store) == [] and not store.partial_files()


class Named:
    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id


class Recorder:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


# -- item 13: peer-chosen text ------------------------------------------------------------------


def test_a_peers_reason_reaches_logs_printable(tmp_path: Path) -> None:
    net = network()
    evil = "busy\n2026-01-01 INFO node: round 9 closed\x1b[2K\r"

    async def main() -> str:
        liar = net.join(Identity.generate(), tmp_path / "liar", role="follower")
        sha = liar.store.put(b"blob")
        liar.held.append(sha)
        await liar.heartbeat(1, None)

        async def rpc_fetch(info: Any, reader: asyncio.StreamReader, writer: Any) -> None:
            await reader.readexactly(4 + len(fetch_request(sha, 4)))
            await reply(writer, Status.REJECTED, reason=evil, limits=DEFAULT_LIMITS)

        liar.service.rpc_fetch = rpc_fetch  # type: ignore[method-assign]
        reader = net.join(Identity.generate(), tmp_path / "reader", role="follower")
        with pytest.raises(TransferError) as info:
            await reader.fetch(sha, 4, 1)
        return str(info.value)

    message = asyncio.run(main())
    assert "REJECTED busy?2026-01-01 INFO node: round 9 closed?[2K?" in message
    assert not any(ch in message for ch in "\n\r\x1b")


def test_a_field_name_a_peer_chose_reaches_the_validators_log_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A signed header with an extra key holding a newline: refused, and nothing it says forges a log line."""
    net = network()
    me = Identity.generate()
    fields = header(me, b"x").model_dump(mode="json") | {"evil\n2026-01-01 INFO forged: accepted": 1}
    body = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    unsigned = SignedMessage("submission", RUN, 0, me.public_key, body, b"")
    envelope = replace(unsigned, signature=me.sign(unsigned.preimage())).to_bytes()

    async def main() -> tuple[Status, str]:
        validator, _ = await open_validator(net, tmp_path)
        async with net.open("Pusher", validator.peer_id, SUBMIT) as (reader, writer):
            await send_request(writer, envelope, DEFAULT_LIMITS)
            status, _, reason = await read_reply(reader, 5)
        await net.shutdown()
        return status, reason

    with caplog.at_level(logging.INFO):
        status, reason = asyncio.run(main())
    assert status is Status.REJECTED and "Extra inputs" in reason and "\n" not in reason
    logged = [r.getMessage() for r in caplog.records if "evil" in r.getMessage()]
    assert logged and not any("\n" in line for line in logged)
