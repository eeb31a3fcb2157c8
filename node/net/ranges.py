"""Parts of blobs, and link probes, on the fetch stream: what joins from several holders and `pulse doctor` need.

Three more requests on `rpc_fetch` (`transfer.py` serves them beside the whole-blob fetch):

    range   client: b"R" | sha256 (32 bytes) | offset u64 | length u64
            server: reply OK + length (or NOT_FOUND, TOO_LARGE: not inside the blob or over the cap,
                    BUSY), then exactly `length` bytes of the blob from `offset`
    down    client: b"P" | length u64            (a download probe)
            server: reply OK + length (or TOO_LARGE over `MAX_PROBE_BYTES`, BUSY), then `length` bytes
    up      client: b"S" | length u64            (an upload probe)
            server: reply OK (or TOO_LARGE, BUSY); client: `length` bytes, which the server reads
                    into nothing; server: reply OK + the microseconds the body took to arrive

A range is checked by its reader piece by piece (`pieces.py`), not here: the server only promises
to send what its blob holds. Probes carry no data anyone stores; their size cap and the fetch
slots they take bound what a stranger can make a node send or read.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time

from node.net.blobstore import BlobStore, check_sha256
from node.net.streams import Status, Stream, TransferLimits, read_reply, reply, send_file, send_request
from protocol.errors import BlobNotFound, MalformedPayload, PeerBusy, TransferError, TransferTimeout

RANGE = struct.Struct(">c32sQQ")
PROBE = struct.Struct(">cQ")
MAX_RANGE_BYTES = 256 << 20  # one request's span; a reader asks again for more
MAX_PROBE_BYTES = 64 << 20
_PROBE_CHUNK = 1 << 20
_NOISE = os.urandom(_PROBE_CHUNK)  # what a download probe sends (incompressible, not secret)


def is_ranged(request: bytes) -> bool:
    """Whether a fetch-stream request is one of this module's (else a whole-blob fetch)."""
    return request[:1] in (b"R", b"P", b"S")


# -- clients ---------------------------------------------------------------------------------------


async def open_range(
    stream: Stream, peer: object, sha256: str, offset: int, length: int, limits: TransferLimits
) -> None:
    """Ask `peer` for `length` bytes of blob `sha256` from `offset`; on return exactly that many body
    bytes follow on the stream's reader. `BlobNotFound`, `PeerBusy` or `TransferError` otherwise."""
    reader, writer = stream
    await send_request(writer, RANGE.pack(b"R", bytes.fromhex(check_sha256(sha256)), offset, length), limits)
    status, size, reason = await read_reply(reader, limits.open_timeout)
    if status is Status.NOT_FOUND:
        raise BlobNotFound(f"{peer} does not hold blob {sha256[:12]}...")
    if status is Status.BUSY:
        raise PeerBusy(f"{peer} is busy: {reason}")
    if status is not Status.OK or size != length:
        raise TransferError(f"{peer} refused bytes {offset}+{length} of {sha256[:12]}...: {status.name} {reason}")


async def probe_down(stream: Stream, peer: object, length: int, limits: TransferLimits) -> float:
    """Seconds from asking `peer` for `length` bytes to the last of them (one round trip included)."""
    reader, writer = stream
    start = time.monotonic()
    await send_request(writer, PROBE.pack(b"P", length), limits)
    status, size, reason = await read_reply(reader, limits.open_timeout)
    if status is Status.BUSY:
        raise PeerBusy(f"{peer} is busy: {reason}")
    if status is not Status.OK or size != length:
        raise TransferError(f"{peer} refused a download probe: {status.name} {reason}")
    remaining = length
    while remaining:
        remaining -= await _read_some(reader, remaining, limits)
    return time.monotonic() - start


async def probe_up(stream: Stream, peer: object, length: int, limits: TransferLimits) -> float:
    """Seconds `peer` measured from its go-ahead to the last of `length` bytes sent to it."""
    reader, writer = stream
    await send_request(writer, PROBE.pack(b"S", length), limits)
    status, _, reason = await read_reply(reader, limits.open_timeout)
    if status is Status.BUSY:
        raise PeerBusy(f"{peer} is busy: {reason}")
    if status is not Status.OK:
        raise TransferError(f"{peer} refused an upload probe: {status.name} {reason}")
    sent = 0
    while sent < length:
        n = min(_PROBE_CHUNK, length - sent)
        writer.write(_NOISE[:n])
        async with asyncio.timeout(limits.chunk_timeout):
            await writer.drain()
        sent += n
    status, micros, reason = await read_reply(reader, limits.open_timeout + length / limits.min_bytes_per_second)
    if status is not Status.OK:
        raise TransferError(f"{peer} did not take the upload probe: {status.name} {reason}")
    return micros / 1e6


async def _read_some(reader: asyncio.StreamReader, most: int, limits: TransferLimits) -> int:
    try:
        async with asyncio.timeout(limits.chunk_timeout):
            chunk = await reader.read(min(limits.read_bytes, most))
    except TimeoutError as exc:
        raise TransferTimeout(f"no data for {limits.chunk_timeout:g}s") from exc
    if not chunk:
        raise TransferError(f"stream closed with {most} bytes to go")
    return len(chunk)


# -- server ----------------------------------------------------------------------------------------


async def serve_ranged(
    store: BlobStore, request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: TransferLimits
) -> int:
    """Answer one range or probe request (the caller holds a fetch slot); the bytes it sent."""
    if request[:1] == b"R" and len(request) == RANGE.size:
        _, raw_sha, offset, length = RANGE.unpack(request)
        return await _serve_range(store, raw_sha.hex(), offset, length, writer, limits)
    if request[:1] in (b"P", b"S") and len(request) == PROBE.size:
        kind, length = PROBE.unpack(request)
        if length > MAX_PROBE_BYTES:
            await reply(writer, Status.TOO_LARGE, reason=f"probes are at most {MAX_PROBE_BYTES} bytes", limits=limits)
            return 0
        if kind == b"P":
            return await _send_noise(length, writer, limits)
        await _take_upload(length, reader, writer, limits)
        return 0
    await reply(writer, Status.REJECTED, reason="not a fetch request", limits=limits)
    raise MalformedPayload("not a fetch request")


async def _serve_range(
    store: BlobStore, sha256: str, offset: int, length: int, writer: asyncio.StreamWriter, limits: TransferLimits
) -> int:
    if not store.has(sha256):
        await reply(writer, Status.NOT_FOUND, limits=limits)
        return 0
    size = store.size(sha256)
    if offset > size or length > size - offset or length > MAX_RANGE_BYTES:
        await reply(writer, Status.TOO_LARGE, reason=f"bytes {offset}+{length} of a {size}-byte blob", limits=limits)
        return 0
    await reply(writer, Status.OK, size=length, limits=limits)
    await send_file(writer, store.path(sha256), length, limits, offset=offset)
    return length


async def _send_noise(length: int, writer: asyncio.StreamWriter, limits: TransferLimits) -> int:
    await reply(writer, Status.OK, size=length, limits=limits)
    sent = 0
    while sent < length:
        n = min(_PROBE_CHUNK, length - sent)
        writer.write(_NOISE[:n])
        async with asyncio.timeout(limits.chunk_timeout):
            await writer.drain()
        sent += n
    return length


async def _take_upload(
    length: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: TransferLimits
) -> None:
    start = time.monotonic()
    await reply(writer, Status.OK, size=length, limits=limits)
    remaining = length
    try:
        async with asyncio.timeout(limits.open_timeout + length / limits.min_bytes_per_second):
            while remaining:
                remaining -= await _read_some(reader, remaining, limits)
    except TimeoutError as exc:
        raise TransferTimeout(f"upload probe slower than {limits.min_bytes_per_second:g} bytes/s") from exc
    await reply(writer, Status.OK, size=int((time.monotonic() - start) * 1e6), limits=limits)
