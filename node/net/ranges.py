"""Parts of blobs, and link probes, on the fetch stream: what joins from several holders and `pulse doctor` need.

Three more requests on `rpc_fetch` (`transfer.py` serves them beside the whole-blob fetch):

    range   client: b"R" | sha256 (32 bytes) | offset u64 | length u64
            server: reply OK + length (or NOT_FOUND, TOO_LARGE: not inside the blob or over the cap,
                    BUSY), then exactly `length` bytes of the blob from `offset`
    down    client: b"P" | length u64 | signed_at_ms u64 | key (32) | signature (64)   (a download probe)
            server: reply OK + length (or TOO_LARGE over `MAX_PROBE_BYTES`, REJECTED, BUSY), then `length` bytes
    up      client: b"S" | the same fields                                            (an upload probe)
            server: reply OK (or TOO_LARGE, REJECTED, BUSY); client: `length` bytes, which the server
                    reads into nothing; server: reply OK + the microseconds the body took to arrive

A range is checked by its reader piece by piece (`pieces.py`), not here: the server only promises
to send what its blob holds. Probes carry no data anyone stores. A probe is signed by a key, for
this run, within `PROBE_CLOCK_SKEW_SECONDS` of now: the server admits a few per key a minute and
the probes of peers without standing under one total byte rate (`budget.ProbeGate`: such a
probe is at most the 16 seconds of that rate the budget saves up), and each has an overall
deadline. Every range and probe takes a send slot first, as a whole blob does.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from dataclasses import dataclass

from node.net.blobstore import BlobStore, check_sha256
from node.net.streams import Status, Stream, TransferLimits, read_reply, reply, send_file, send_request
from protocol.errors import BlobNotFound, InvalidSignature, MalformedPayload, PeerBusy, TransferError, TransferTimeout
from protocol.identity import Identity, verify_signature

RANGE = struct.Struct(">c32sQQ")
PROBE = struct.Struct(">cQQ32s64s")  # kind, length, signed_at_ms, key, signature
_PROBE_SIGNED = struct.Struct(">cQQ32s")  # what the signature covers (after the domain and run id)
PROBE_CLOCK_SKEW_SECONDS = 120.0
MAX_RANGE_BYTES = 256 << 20  # one request's span; a reader asks again for more
MAX_PROBE_BYTES = 64 << 20
_PROBE_CHUNK = 1 << 20
_NOISE = os.urandom(_PROBE_CHUNK)  # what a download probe sends (incompressible, not secret)


def is_ranged(request: bytes) -> bool:
    """Whether a fetch-stream request is one of this module's (else a whole-blob fetch)."""
    return request[:1] in (b"R", b"P", b"S")


@dataclass(frozen=True)
class Ask:
    """A parsed range or probe request: `kind` is b"R", b"P" or b"S"."""

    kind: bytes
    length: int
    sha256: str = ""  # a range's blob
    offset: int = 0  # a range's first byte
    signer: str = ""  # a probe's key (hex)


def sign_probe(identity: Identity, run_id: str, kind: bytes, length: int) -> bytes:
    """A probe request (`kind` b"P" or b"S") signed by `identity` for run `run_id`, now."""
    head = _PROBE_SIGNED.pack(kind, length, int(time.time() * 1000), identity.public_key)
    return head + identity.sign(_probe_preimage(run_id, head))


def parse_ranged(request: bytes, run_id: str) -> Ask:
    """What a range or probe request asks; `MalformedPayload` or `InvalidSignature` (a probe not
    signed for this run, or signed too far from now) if it is not one to serve."""
    if request[:1] == b"R" and len(request) == RANGE.size:
        _, raw_sha, offset, length = RANGE.unpack(request)
        return Ask(b"R", length, sha256=raw_sha.hex(), offset=offset)
    if request[:1] in (b"P", b"S") and len(request) == PROBE.size:
        kind, length, signed_at_ms, key, signature = PROBE.unpack(request)
        if abs(signed_at_ms / 1000 - time.time()) > PROBE_CLOCK_SKEW_SECONDS:
            raise InvalidSignature("probe signed too far from now")
        verify_signature(key, _probe_preimage(run_id, request[: _PROBE_SIGNED.size]), signature)
        return Ask(kind, length, signer=key.hex())
    if request[:1] in (b"P", b"S"):
        raise InvalidSignature("a probe must be signed by a key of the run")
    raise MalformedPayload("not a fetch request")


def _probe_preimage(run_id: str, head: bytes) -> bytes:
    return b"pulse/probe\0" + run_id.encode() + b"\0" + head


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


async def probe_down(stream: Stream, peer: object, length: int, limits: TransferLimits, *, signed: bytes) -> float:
    """Seconds from asking `peer` for `length` bytes to the last of them (one round trip included);
    `signed` is the request (`sign_probe(identity, run_id, b"P", length)`)."""
    reader, writer = stream
    start = time.monotonic()
    await send_request(writer, signed, limits)
    status, size, reason = await read_reply(reader, limits.open_timeout)
    if status is Status.BUSY:
        raise PeerBusy(f"{peer} is busy: {reason}")
    if status is not Status.OK or size != length:
        raise TransferError(f"{peer} refused a download probe: {status.name} {reason}")
    remaining = length
    while remaining:
        remaining -= await _read_some(reader, remaining, limits)
    return time.monotonic() - start


async def probe_up(stream: Stream, peer: object, length: int, limits: TransferLimits, *, signed: bytes) -> float:
    """Seconds `peer` measured from its go-ahead to the last of `length` bytes sent to it; `signed`
    is the request (`sign_probe(identity, run_id, b"S", length)`)."""
    reader, writer = stream
    await send_request(writer, signed, limits)
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


async def refuse_ranged(store: BlobStore, ask: Ask, writer: asyncio.StreamWriter, limits: TransferLimits) -> bool:
    """Answer NOT_FOUND or TOO_LARGE if `ask` cannot be served (no slot needed to say so); whether it did."""
    if ask.kind != b"R":
        if ask.length <= MAX_PROBE_BYTES:
            return False
        await reply(writer, Status.TOO_LARGE, reason=f"probes are at most {MAX_PROBE_BYTES} bytes", limits=limits)
        return True
    if not store.has(ask.sha256):
        await reply(writer, Status.NOT_FOUND, limits=limits)
        return True
    size = store.size(ask.sha256)
    if ask.offset > size or ask.length > size - ask.offset or ask.length > MAX_RANGE_BYTES:
        reason = f"bytes {ask.offset}+{ask.length} of a {size}-byte blob"
        await reply(writer, Status.TOO_LARGE, reason=reason, limits=limits)
        return True
    return False


async def serve_ranged(
    store: BlobStore, ask: Ask, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: TransferLimits
) -> int:
    """Serve one range or probe `refuse_ranged` let through (the caller holds a send slot); the bytes
    it sent. A probe has `max_probe_seconds` in all; a range the time its length allows at the minimum rate."""
    if ask.kind == b"R":
        return await _serve_range(store, ask.sha256, ask.offset, ask.length, writer, limits)
    try:
        async with asyncio.timeout(limits.max_probe_seconds):
            if ask.kind == b"P":
                return await _send_noise(ask.length, writer, limits)
            await _take_upload(ask.length, reader, writer, limits)
            return 0
    except TimeoutError as exc:
        raise TransferTimeout(f"probe of {ask.length} bytes not done within {limits.max_probe_seconds:g}s") from exc


async def _serve_range(
    store: BlobStore, sha256: str, offset: int, length: int, writer: asyncio.StreamWriter, limits: TransferLimits
) -> int:
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
