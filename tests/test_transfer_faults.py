"""Faults at the receiving end of a submission, in process: a trickling sender, a round that closes
while a body arrives (after it, and before it is whole), two bodies from one sender at once, and a
full disk.

The submit handler runs on an `asyncio.StreamReader` fed by the test and a writer that records
what the handler replies, so no libp2p daemon is needed.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import struct
from pathlib import Path
from typing import Any

import pytest

from node.net.blobstore import BlobStore, BlobWriter
from node.net.streams import Status, TransferLimits, receive_body
from node.net.transfer import Handlers, TransferService
from protocol.errors import TransferTimeout
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.signing import Verified, sign

RUN = hashlib.sha256(b"pulse-test-transfer-faults").hexdigest()
_REPLY = struct.Struct(">BQH")


class RecordingWriter:
    """The bits of `asyncio.StreamWriter` the handler uses; keeps every byte written."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None

    def replies(self) -> list[tuple[Status, str]]:
        out, at = [], 0
        while at < len(self.data):
            status, _, n = _REPLY.unpack_from(self.data, at)
            at += _REPLY.size
            out.append((Status(status), self.data[at : at + n].decode()))
            at += n
        return out


def _submission(identity: Identity, payload: bytes, round_: int = 0) -> bytes:
    header = SubmissionHeader.for_payload(
        run_id=RUN,
        round_=round_,
        base_hash="0" * 64,
        payload=payload,
        codec="sparseloco",
        data_digest="1" * 64,
        sender=identity.public_hex,
    )
    return sign(identity, header).to_bytes()


def _request(envelope: bytes) -> bytes:
    return struct.pack(">I", len(envelope)) + envelope


async def _trickle(reader: asyncio.StreamReader, data: bytes, step: int, pause: float) -> None:
    for at in range(0, len(data), step):
        reader.feed_data(data[at : at + step])
        await asyncio.sleep(pause)


def test_a_trickling_body_is_cut_at_the_minimum_rate(tmp_path: Path) -> None:
    """10 bytes every 20 ms is 500 bytes/s: 2000 bytes would take 4 s, well under the 5 s stall limit."""
    limits = TransferLimits(open_timeout=0.3, chunk_timeout=5.0, min_bytes_per_second=2000)
    data = bytes(2000)

    async def main() -> float:
        reader = asyncio.StreamReader()
        feeder = asyncio.ensure_future(_trickle(reader, data, 10, 0.02))
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            blob = BlobWriter(BlobStore(tmp_path), hashlib.sha256(data).hexdigest(), len(data))
            with blob, pytest.raises(TransferTimeout, match="too slow"):
                await receive_body(reader, blob, limits)
        finally:
            feeder.cancel()
        return loop.time() - start

    assert asyncio.run(main()) < 2.0  # 0.3 s + 2000 / 2000 s allowed, not the 4 s the trickle needs
    assert not BlobStore(tmp_path).partial_files()


class FakeInfo:
    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id


def _service(tmp_path: Path, got: list[Verified[SubmissionHeader]], late: str | None = None) -> TransferService:
    """Every header accepted; after its body, `late` refuses it (None: handed to `got`)."""

    def take(verified: Verified[SubmissionHeader], path: Path) -> str | None:
        if late is None:
            got.append(verified)
        return late

    store = BlobStore(tmp_path / "store")
    return TransferService(
        p2p=Any,  # type: ignore[arg-type]  # the handler never touches the daemon
        store=store,
        run_id=RUN,
        intake=Handlers(store, accept=lambda header: None, on_submission=take),
    )


async def _submit(service: TransferService, envelope: bytes, payload: bytes) -> RecordingWriter:
    reader, writer = asyncio.StreamReader(), RecordingWriter()
    reader.feed_data(_request(envelope) + payload)
    reader.feed_eof()
    await service.rpc_submit(FakeInfo("miner"), reader, writer)  # type: ignore[arg-type]
    return writer


def test_a_round_that_closes_while_the_body_arrives_refuses_it_with_a_reason(tmp_path: Path) -> None:
    got: list[Verified[SubmissionHeader]] = []
    service = _service(tmp_path, got, late="round 0 is not open (the open round is 1, closed=True)")
    payload = b"x" * 1000
    writer = asyncio.run(_submit(service, _submission(Identity.generate(), payload), payload))
    assert got == []  # never handed to the round
    refusal = (Status.REJECTED, "round 0 is not open (the open round is 1, closed=True)")
    assert writer.replies() == [(Status.OK, ""), refusal]


def test_a_body_still_arriving_when_its_round_closes_is_cut_and_its_slot_freed(tmp_path: Path) -> None:
    """A trickling sender keeps its stream only while the round is open: at the close the handler stops
    reading, tells it why, stores nothing, and the submit slot is free again (not at the body's deadline)."""
    got: list[Verified[SubmissionHeader]] = []
    closed: list[str] = []
    store = BlobStore(tmp_path / "store")
    service = TransferService(
        p2p=Any,  # type: ignore[arg-type]
        store=store,
        run_id=RUN,
        intake=Handlers(
            store,
            accept=lambda header: None,
            on_submission=lambda verified, path: got.append(verified),  # type: ignore[func-returns-value]
            void=lambda header: closed[0] if closed else None,
        ),
    )
    payload = b"z" * 4096

    async def main() -> tuple[RecordingWriter, float]:
        reader, writer = asyncio.StreamReader(), RecordingWriter()
        reader.feed_data(_request(_submission(Identity.generate(), payload)) + payload[:100])  # then nothing
        task = asyncio.ensure_future(service.rpc_submit(FakeInfo("trickler"), reader, writer))  # type: ignore[arg-type]
        await asyncio.sleep(0.3)
        assert service.submits.used == 1 and not task.done()
        closed.append("round 0 closed while its body arrived")
        started = asyncio.get_running_loop().time()
        while len(writer.replies()) < 2 and asyncio.get_running_loop().time() - started < 5:
            await asyncio.sleep(0.05)
        took = asyncio.get_running_loop().time() - started
        assert service.submits.used == 0  # free before the peer even hangs up
        reader.feed_eof()  # the sender reads its answer and hangs up
        await asyncio.wait_for(task, 5)
        return writer, took

    writer, took = asyncio.run(main())
    assert writer.replies() == [(Status.OK, ""), (Status.REJECTED, "round 0 closed while its body arrived")]
    assert took < 2 and got == [] and list(store) == []


def test_two_bodies_from_one_sender_give_one_submission_and_one_refusal(tmp_path: Path) -> None:
    """A signer has one body in flight at a time: the second push of a key is BUSY, not a second upload."""
    got: list[Verified[SubmissionHeader]] = []
    me = Identity.generate()
    received: set[str] = set()

    def accept(header: SubmissionHeader) -> str | None:
        return "one submission per miner per round" if header.sender in received else None

    def take(verified: Verified[SubmissionHeader], path: Path) -> str | None:
        if (refused := accept(verified.message)) is None:
            received.add(verified.message.sender)
            got.append(verified)
        return refused

    store = BlobStore(tmp_path / "store")
    service = TransferService(
        p2p=Any,  # type: ignore[arg-type]
        store=store,
        run_id=RUN,
        intake=Handlers(store, accept=accept, on_submission=take),
    )

    async def main() -> list[RecordingWriter]:
        # both headers are admitted before either body is complete
        readers = [asyncio.StreamReader(), asyncio.StreamReader()]
        writers = [RecordingWriter(), RecordingWriter()]
        payloads = [b"a" * 500, b"b" * 500]
        for reader, payload in zip(readers, payloads, strict=True):
            reader.feed_data(_request(_submission(me, payload)))
        tasks = [
            asyncio.ensure_future(service.rpc_submit(FakeInfo(f"p{i}"), r, w))  # type: ignore[arg-type]
            for i, (r, w) in enumerate(zip(readers, writers, strict=True))
        ]
        await asyncio.sleep(0.05)
        for reader, payload in zip(readers, payloads, strict=True):
            reader.feed_data(payload)
            reader.feed_eof()
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        return writers

    first, second = asyncio.run(main())
    assert len(got) == 1 and got[0].message.payload_sha256 == hashlib.sha256(b"a" * 500).hexdigest()
    assert first.replies()[-1] == (Status.OK, "")
    assert second.replies() == [(Status.BUSY, "a submission of this key is already arriving")]


def test_a_full_disk_while_receiving_is_a_failed_reply_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: BlobWriter, chunks: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(BlobWriter, "write_many", full)
    got: list[Verified[SubmissionHeader]] = []
    service = _service(tmp_path, got)
    payload = b"y" * 1000
    writer = asyncio.run(_submit(service, _submission(Identity.generate(), payload), payload))
    assert got == []
    status, reason = writer.replies()[-1]
    assert status is Status.FAILED and "No space left" in reason
    store = BlobStore(tmp_path / "store")
    assert not store.partial_files() and not list(store)


def test_one_peer_cannot_take_every_stream_slot(tmp_path: Path) -> None:
    """A flood of streams from one peer id is answered BUSY past `max_streams_per_peer`, while
    another peer is still served."""
    service = TransferService(
        p2p=Any,  # type: ignore[arg-type]
        store=BlobStore(tmp_path / "store"),
        run_id=RUN,
        limits=TransferLimits(max_streams_per_peer=4, open_timeout=0.5),
    )
    release = asyncio.Event()
    served: list[bytes] = []

    async def handler(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(request)
        await release.wait()

    async def stream(peer: str) -> RecordingWriter:
        reader, writer = asyncio.StreamReader(), RecordingWriter()
        reader.feed_data(_request(b"F"))
        reader.feed_eof()
        await service._serve("fetch", handler, FakeInfo(peer), reader, writer)  # type: ignore[arg-type]
        return writer

    async def main() -> tuple[list[RecordingWriter], RecordingWriter]:
        flood = [asyncio.ensure_future(stream("sybil")) for _ in range(6)]
        other = asyncio.ensure_future(stream("honest"))
        await asyncio.sleep(0.1)
        assert len(served) == 5  # four of the flood, and the other peer
        release.set()
        return list(await asyncio.gather(*flood)), await other

    flood, other = asyncio.run(main())
    busy = [w for w in flood if w.replies() and w.replies()[0][0] is Status.BUSY]
    assert len(busy) == 2 and not other.replies()
    assert service.active == 0 and service._per_peer == {}
