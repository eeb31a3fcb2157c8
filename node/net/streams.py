"""Framing and byte pumps for blob streams, shared by `transfer.py`'s handlers and clients.

Framing (integers big-endian):

    request  u32 length | bytes (<= 64 KiB)
    reply    status u8 | size u64 | u16 length | reason (ASCII)
    body     exactly `size` raw bytes

`receive_body` writes into a `BlobWriter` (temp file, incremental SHA-256, rename only after the
size and hash check), never reads past the announced size and bounds every read by
`chunk_timeout`. Hashing and disk writes run in an executor, one batch in flight while the next
is read, so they overlap the network; `send_file` likewise reads ahead from disk.

Both directions have a minimum rate (`min_bytes_per_second`): a body must arrive, and a blob must
be taken by its reader, within `open_timeout + size / min_bytes_per_second`, so a peer that
trickles (or reads a byte now and then) cannot hold a slot for long. A request must arrive whole
within `request_timeout`. A reason a peer sends is made printable before anyone logs it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path

from hivemind.p2p import P2P, P2PDaemonError, P2PHandlerError, PeerID
from pydantic import BaseModel, Field

from node.net.blobstore import BlobWriter
from protocol.errors import BlobNotFound, MalformedPayload, SizeLimitExceeded, TransferError, TransferTimeout
from protocol.parsing import STRICT

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
_LINGER_BYTES = 1 << 20
_REPLY = struct.Struct(">BQH")
# What a failed peer does to a stream: close it, reset it, or break the daemon connection.
STREAM_ERRORS = (ConnectionError, OSError, asyncio.IncompleteReadError, P2PDaemonError, P2PHandlerError)


class Status(enum.IntEnum):
    OK = 0
    NOT_FOUND = 1
    TOO_LARGE = 2
    BUSY = 3
    REJECTED = 4
    FAILED = 5
    DUPLICATE = 6


class TransferLimits(BaseModel):
    """Caps and timeouts for blob streams, both directions."""

    model_config = STRICT

    max_blob_bytes: int = Field(default=4 * 2**30, ge=0)
    """Largest blob this node serves or accepts."""
    chunk_timeout: float = Field(default=30.0, gt=0)
    """Seconds without progress (a read, a drain) before a stream is abandoned."""
    open_timeout: float = Field(default=20.0, gt=0)
    """Seconds to open a stream and get the peer's first reply."""
    hedge_after: float = Field(default=2.0, gt=0)
    """Seconds a fetch waits on its holders before it also asks the next one (`fetching.py`)."""
    hedge_rate: float = Field(default=1 << 20, gt=0)
    """A body arriving at this rate (bytes/s) or faster is not raced with another holder."""
    request_timeout: float = Field(default=5.0, gt=0)
    """Seconds a served stream has to send its whole request (a silent stream is dropped then)."""
    max_requests: int = Field(default=64, ge=1)
    """Served streams whose request is still being read or decided; more are answered BUSY.
    Cheap (a request is at most 64 KiB) and short (`request_timeout`), so it can be large."""
    reserved_requests: int = Field(default=16, ge=0)
    """Of `max_requests`, the slots only peers with standing may take (`reserved_fetch_streams`)."""
    max_fetch_streams: int = Field(default=16, ge=1)
    """Blobs sent at once; more fetches are answered BUSY."""
    max_submit_streams: int = Field(default=8, ge=1)
    """Submission bodies received at once (after their signed header was accepted); more BUSY."""
    reserved_submit_streams: int = Field(default=4, ge=0)
    """Of `max_submit_streams`, the slots only senders this node favours may take (the validator
    favours miners with a rating history), so fresh keys cannot take every slot."""
    max_rollout_streams: int = Field(default=4, ge=1)
    """Rollout batches (RL) received at once, apart from submissions: a flood of one kind of push
    never holds the slots of the other; more BUSY."""
    reserved_rollout_streams: int = Field(default=2, ge=0)
    """Of `max_rollout_streams`, the slots only workers whose batches passed before may take."""
    reserved_fetch_streams: int = Field(default=6, ge=0)
    """Of `max_fetch_streams`, the slots only peers with standing may take (a run's validators'
    peers, holders that delivered a verified blob: `budget.Standing`), so fresh peer ids cannot
    hold every send slot. Blobs, ranges and probes all take from the same slots."""
    probes_per_key_per_minute: int = Field(default=4, ge=1)
    """Link probes one signing key may ask for a minute (`ranges.py`)."""
    unknown_probe_bytes_per_second: float = Field(default=1 << 20, gt=0)
    """The uplink share probes of peers without standing may take, all of them together."""
    max_probe_seconds: float = Field(default=60.0, gt=0)
    """Overall deadline of one probe, whatever its reader does (a probe is at most 64 MiB)."""
    max_streams_per_peer: int = Field(default=4, ge=1)
    """Streams served at once to one libp2p peer. Peer ids cost nothing, so this only spreads the
    slots of one careless host; the budgets above are what bound a flood."""
    read_bytes: int = Field(default=1 << 20, ge=4096)
    """Largest single socket read."""
    batch_bytes: int = Field(default=8 << 20, ge=4096)
    """Bytes handed to the hashing/writing thread at a time (two batches in memory per stream)."""
    min_bytes_per_second: float = Field(default=64 * 1024, gt=0)
    """Slowest transfer accepted, both ways: a body must arrive (or be taken by the reader) within
    `open_timeout` + size / this rate, so a peer that trickles cannot hold a slot for long."""

    def body_seconds(self, size: int) -> float:
        """The most a body of `size` bytes may take, at the minimum rate."""
        return self.open_timeout + size / self.min_bytes_per_second


DEFAULT_LIMITS = TransferLimits()


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@asynccontextmanager
async def open_stream(p2p: P2P, peer: PeerID, name: str, limits: TransferLimits) -> AsyncIterator[Stream]:
    """An open stream to `peer`'s handler `name`; every peer failure inside becomes a `TransferError`."""

    async def opening() -> Stream:
        _, reader, writer = await p2p.call_binary_stream_handler(peer, name)
        return reader, writer

    async with guarded_stream(opening(), peer, limits) as stream:
        yield stream


@asynccontextmanager
async def guarded_stream(opening: Awaitable[Stream], peer: object, limits: TransferLimits) -> AsyncIterator[Stream]:
    """The stream `opening` gives, opened within `open_timeout`, closed on the way out; a stall
    becomes a `TransferTimeout` and a broken stream a `TransferError` (any transport: libp2p, in memory)."""
    try:
        reader, writer = await asyncio.wait_for(opening, limits.open_timeout)
    except TimeoutError as exc:
        raise TransferTimeout(f"could not open a stream to {peer} within {limits.open_timeout:.0f}s") from exc
    except STREAM_ERRORS as exc:
        raise TransferError(f"could not open a stream to {peer}: {exc}") from exc
    try:
        yield reader, writer
    except TimeoutError as exc:
        raise TransferTimeout(f"{peer} stalled for more than {limits.chunk_timeout:.0f}s") from exc
    except STREAM_ERRORS as exc:
        raise TransferError(f"stream to {peer} broke: {exc or type(exc).__name__}") from exc
    finally:
        writer.close()


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float) -> None:
    """Close a served stream only once the peer has hung up (or `timeout` passed).

    The libp2p daemon resets a stream whose local end closes while the other direction is still
    open, and a reset can drop bytes it has not flushed yet: the tail of a body, or a final
    reply. So the side that writes last waits for the peer's EOF first. Anything the peer still
    sends is read into nothing (at most `_LINGER_BYTES`), never stored.
    """
    try:
        async with asyncio.timeout(timeout):
            await writer.drain()
            discarded = 0
            while discarded <= _LINGER_BYTES and (chunk := await reader.read(1 << 16)):
                discarded += len(chunk)
    except (TimeoutError, *STREAM_ERRORS) as exc:
        logger.debug("peer did not hang up cleanly: %s", exc or type(exc).__name__)
    finally:
        writer.close()


async def receive_body(reader: asyncio.StreamReader, blob: BlobWriter, limits: TransferLimits) -> None:
    """Read exactly `blob.size` bytes into `blob`; a read waiting past `chunk_timeout`, or a body slower
    than `min_bytes_per_second` on the whole, is a `TransferTimeout`."""
    loop = asyncio.get_running_loop()
    remaining = blob.size
    started = loop.time()
    overall = started + limits.body_seconds(blob.size)
    batch: list[bytes] = []
    batched = 0
    pending: asyncio.Future[None] | None = None  # the batch being hashed and written, at most one
    try:
        async with asyncio.timeout(None) as deadline:
            while remaining:
                deadline.reschedule(min(loop.time() + limits.chunk_timeout, overall))
                chunk = await reader.read(min(limits.read_bytes, remaining))  # never past the announced size
                if not chunk:
                    raise TransferError(f"peer closed the stream after {blob.size - remaining} of {blob.size} bytes")
                remaining -= len(chunk)
                batch.append(chunk)
                batched += len(chunk)
                if batched >= limits.batch_bytes or not remaining:
                    if pending is not None:
                        await pending
                    pending = loop.run_in_executor(None, blob.write_many, batch)
                    batch, batched = [], 0
        if pending is not None:
            await pending
    except TimeoutError as exc:
        done = blob.size - remaining
        if loop.time() >= overall:
            raise TransferTimeout(
                f"peer too slow: {done} of {blob.size} bytes after the {overall - started:.1f}s allowed "
                f"(minimum rate {limits.min_bytes_per_second:g} bytes/s)"
            ) from exc
        raise TransferTimeout(
            f"peer stalled: no data for {limits.chunk_timeout:g}s after {done} of {blob.size} bytes"
        ) from exc
    finally:
        if pending is not None and not pending.done():
            await asyncio.wait([pending])  # the thread still writes into the temp file: let it finish first


async def send_file(
    writer: asyncio.StreamWriter, path: Path, size: int, limits: TransferLimits, *, offset: int = 0
) -> None:
    """Stream `size` bytes of `path` from `offset`, reading the next chunk from disk while the last one drains.

    A reader that takes no data for `chunk_timeout`, or takes the whole slower than the minimum
    rate, is a `TransferTimeout`."""
    if size == 0:
        return
    loop = asyncio.get_running_loop()
    allowed = limits.body_seconds(size)
    try:
        async with asyncio.timeout(allowed):
            await _send_chunks(writer, path, size, limits, loop, offset)
    except TimeoutError as exc:
        raise TransferTimeout(f"reader too slow: {size} bytes not taken within {allowed:.1f}s") from exc


async def _send_chunks(
    writer: asyncio.StreamWriter,
    path: Path,
    size: int,
    limits: TransferLimits,
    loop: asyncio.AbstractEventLoop,
    offset: int,
) -> None:
    with path.open("rb", buffering=0) as f:
        f.seek(offset)
        sent = 0
        next_chunk: asyncio.Future[bytes] | None = loop.run_in_executor(None, f.read, min(limits.batch_bytes, size))
        try:
            while next_chunk is not None:
                chunk = await next_chunk
                next_chunk = None
                if not chunk:
                    raise BlobNotFound(f"{path} ended after {sent} of {size} bytes")
                sent += len(chunk)
                if sent < size:
                    next_chunk = loop.run_in_executor(None, f.read, min(limits.batch_bytes, size - sent))
                writer.write(chunk)
                try:
                    async with asyncio.timeout(limits.chunk_timeout):
                        await writer.drain()
                except TimeoutError as exc:
                    raise TransferTimeout(f"reader took nothing for {limits.chunk_timeout:g}s") from exc
        finally:
            if next_chunk is not None:
                await asyncio.wait([next_chunk])  # a read in flight must finish before the file closes


async def send_request(writer: asyncio.StreamWriter, request: bytes, limits: TransferLimits) -> None:
    writer.write(struct.pack(">I", len(request)) + request)
    async with asyncio.timeout(limits.open_timeout):
        await writer.drain()


async def read_request(reader: asyncio.StreamReader, limits: TransferLimits) -> bytes:
    """A served stream's request, whole within `request_timeout` (a silent stream times out)."""
    async with asyncio.timeout(limits.request_timeout):
        (length,) = struct.unpack(">I", await reader.readexactly(4))
        if length > MAX_REQUEST_BYTES:
            raise SizeLimitExceeded(f"request of {length} bytes, cap is {MAX_REQUEST_BYTES}")
        return await reader.readexactly(length)


async def reply(
    writer: asyncio.StreamWriter, status: Status, *, size: int = 0, reason: str = "", limits: TransferLimits
) -> None:
    text = reason.encode("ascii", errors="replace")[:1024]
    writer.write(_REPLY.pack(status, size, len(text)) + text)
    async with asyncio.timeout(limits.chunk_timeout):
        await writer.drain()


def printable(raw: bytes | str, limit: int = 200) -> str:
    """Peer-chosen text made safe to log: printable ASCII only, one line, at most `limit` characters."""
    raw = raw.encode("utf-8", errors="replace") if isinstance(raw, str) else raw
    text = "".join(chr(b) if 0x20 <= b < 0x7F else "?" for b in raw[:limit])
    return text + ("..." if len(raw) > limit else "")


async def try_reply(writer: asyncio.StreamWriter, status: Status, reason: str, limits: TransferLimits) -> None:
    """Best effort: tell the peer why we stop; the stream may already be gone."""
    try:
        await reply(writer, status, reason=reason, limits=limits)
    except (TimeoutError, *STREAM_ERRORS) as exc:
        logger.debug("could not send %s reply: %s", status.name, exc)


async def read_reply(reader: asyncio.StreamReader, timeout: float) -> tuple[Status, int, str]:
    async with asyncio.timeout(timeout):
        raw_status, size, reason_len = _REPLY.unpack(await reader.readexactly(_REPLY.size))
        reason = printable(await reader.readexactly(reason_len))
    try:
        return Status(raw_status), size, reason
    except ValueError as exc:
        raise MalformedPayload(f"unknown reply status {raw_status}") from exc
