"""Blobs over hivemind P2P streams: `rpc_fetch` / `rpc_submit` handlers, `call_fetch` / `call_submit` clients.

`fetch` streams a blob this node holds to any peer that asks (so every holder re-serves what it
has); `submit` lets a node that cannot accept connections push a payload to a reachable one.

The two conversations (framing and byte pumps are `streams.py`):

    fetch   client: request b"F" | sha256 (32 bytes) | max size u64
            server: reply OK + size (or NOT_FOUND, TOO_LARGE, BUSY), then the body
    submit  client: request = a signed `SubmissionHeader` envelope
            server: reply OK (or REJECTED, DUPLICATE, TOO_LARGE, BUSY) before any body byte is sent
            client: the body, exactly `payload_size` bytes
            server: reply OK once the blob is verified and stored (or FAILED with the reason)

On any failure nothing is stored; a handler logs the peer's failure and never raises.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from hivemind.p2p import P2P, PeerID

from node.net.blobstore import BlobStore, check_sha256
from node.net.streams import (
    DEFAULT_LIMITS,
    STREAM_ERRORS,
    Status,
    Stream,
    TransferLimits,
    hang_up,
    open_stream,
    read_reply,
    read_request,
    receive_body,
    reply,
    send_file,
    send_request,
    try_reply,
)
from protocol.errors import BlobNotFound, MalformedPayload, ProtocolError, SizeLimitExceeded, TransferError
from protocol.messages import PROTOCOL_VERSION, SubmissionHeader
from protocol.signing import SeenCache, SignedMessage, Verified, open_signed

logger = logging.getLogger(__name__)

FETCH = f"pulse/v{PROTOCOL_VERSION}/rpc_fetch"
SUBMIT = f"pulse/v{PROTOCOL_VERSION}/rpc_submit"
_FETCH_REQUEST = struct.Struct(">c32sQ")
P = TypeVar("P")


# -- clients -------------------------------------------------------------------------------------


async def call_fetch(
    p2p: P2P, peer: PeerID, sha256: str, store: BlobStore, *, max_size: int, limits: TransferLimits = DEFAULT_LIMITS
) -> Path:
    """Fetch blob `sha256` from `peer` into `store`; its path once verified.

    Raises `BlobNotFound`, `SizeLimitExceeded` (announced size above `max_size`, before any body
    byte is read), `BlobHashMismatch`, `TransferTimeout` or `TransferError`; then nothing is stored.
    """
    check_sha256(sha256)
    if store.has(sha256):
        return store.path(sha256)
    async with open_stream(p2p, peer, FETCH, limits) as stream:
        return await fetch_over(stream, peer, sha256, store, max_size=max_size, limits=limits)


async def fetch_over(
    stream: Stream, peer: object, sha256: str, store: BlobStore, *, max_size: int, limits: TransferLimits
) -> Path:
    """The client side of a fetch on an open stream (`call_fetch`; the in-memory network uses it too)."""
    reader, writer = stream
    await send_request(writer, fetch_request(sha256, max_size), limits)
    status, size, reason = await read_reply(reader, limits.open_timeout)
    if status is Status.NOT_FOUND:
        raise BlobNotFound(f"{peer} does not hold blob {sha256[:12]}...")
    if status is not Status.OK:
        raise TransferError(f"{peer} refused to send {sha256[:12]}...: {status.name} {reason}")
    if size > max_size:
        raise SizeLimitExceeded(f"{peer} announced {size} bytes for {sha256[:12]}..., cap is {max_size}")
    with store.writer(sha256, size) as blob:
        await receive_body(reader, blob, limits)
        return await asyncio.get_running_loop().run_in_executor(None, blob.commit)


def fetch_request(sha256: str, max_size: int) -> bytes:
    return _FETCH_REQUEST.pack(b"F", bytes.fromhex(check_sha256(sha256)), max_size)


async def fetch_from_any(
    p2p: P2P,
    peers: Sequence[PeerID],
    sha256: str,
    store: BlobStore,
    *,
    max_size: int,
    limits: TransferLimits = DEFAULT_LIMITS,
) -> Path:
    """Try holders in random order (spreading load over everyone who re-serves the blob)."""
    return await first_holder(
        peers, sha256, lambda peer: call_fetch(p2p, peer, sha256, store, max_size=max_size, limits=limits)
    )


async def first_holder(peers: Sequence[P], sha256: str, fetch: Callable[[P], Awaitable[Path]]) -> Path:
    """`fetch` from each of `peers` in random order until one delivers; `TransferError` naming every failure."""
    failures = []
    for peer in random.sample(list(peers), len(peers)):
        try:
            return await fetch(peer)
        except (TransferError, ProtocolError) as exc:
            logger.info("fetch of %s... from %s failed: %s", sha256[:12], peer, exc)
            failures.append(f"{peer}: {exc}")
    raise TransferError(f"no holder delivered {sha256[:12]}... ({'; '.join(failures) or 'no holders'})")


async def call_submit(
    p2p: P2P, peer: PeerID, signed: SignedMessage, payload: Path, *, limits: TransferLimits = DEFAULT_LIMITS
) -> bool:
    """Push a signed submission header and its payload file to `peer`.

    True once the peer verified and stored it; False if it already had this exact message.
    """
    async with open_stream(p2p, peer, SUBMIT, limits) as stream:
        return await submit_over(stream, peer, signed, payload, limits=limits)


async def submit_over(
    stream: Stream, peer: object, signed: SignedMessage, payload: Path, *, limits: TransferLimits
) -> bool:
    """The client side of a submission on an open stream (`call_submit`; the in-memory network uses it too)."""
    header = SubmissionHeader.from_canonical(signed.body)
    if payload.stat().st_size != header.payload_size:
        raise SizeLimitExceeded(f"{payload} is not the {header.payload_size} bytes its header announces")
    reader, writer = stream
    await send_request(writer, signed.to_bytes(), limits)
    status, _, reason = await read_reply(reader, limits.open_timeout)
    if status is Status.DUPLICATE:
        return False
    if status is not Status.OK:
        raise TransferError(f"{peer} refused the submission: {status.name} {reason}")
    await send_file(writer, payload, header.payload_size, limits)
    status, _, reason = await read_reply(reader, limits.chunk_timeout)
    if status is not Status.OK:
        raise TransferError(f"{peer} did not store the submission: {status.name} {reason}")
    return True


# -- server --------------------------------------------------------------------------------------

Accept = Callable[[SubmissionHeader], str | None]
"""Decides on a verified header before its body is read: a rejection reason, or None to accept."""
OnSubmission = Callable[[Verified[SubmissionHeader]], None]


REFUSAL_STATUSES = tuple(s.name.lower() for s in Status if s is not Status.OK and s is not Status.NOT_FOUND)
"""How a pushed submission can be refused (`TransferCounts.refused` keys)."""


@dataclass
class TransferCounts:
    """What this node's transfer service did for others, for metrics (plain integers, read at any time)."""

    served_bytes: int = 0  # blob bytes streamed to peers that fetched them
    refused: Counter[str] = field(default_factory=Counter)  # pushed submissions refused, by `REFUSAL_STATUSES`

    def refuse(self, status: Status) -> None:
        self.refused[status.name.lower()] += 1


class Origin(Protocol):
    """Who opened a served stream (hivemind's `StreamInfo`, or an in-memory peer)."""

    @property
    def peer_id(self) -> object: ...


class TransferService:
    """Serves this node's blob store to peers and receives pushed submissions. Never raises on peer input."""

    def __init__(
        self,
        p2p: P2P | None,  # None: served in process (the in-memory network opens the streams)
        store: BlobStore,
        *,
        run_id: str,
        limits: TransferLimits = DEFAULT_LIMITS,
        accept: Accept | None = None,
        on_submission: OnSubmission | None = None,
        seen: SeenCache | None = None,
    ) -> None:
        self.p2p, self.store, self.run_id, self.limits = p2p, store, run_id, limits
        self.accept, self.on_submission = accept, on_submission
        self.seen = seen if seen is not None else SeenCache()  # pass a persisted one to survive restarts
        self.active = 0
        self._per_peer: dict[object, int] = {}  # open streams by peer: one peer cannot take every slot
        self._receiving: set[str] = set()
        self.counts = TransferCounts()

    @classmethod
    async def create(
        cls,
        p2p: P2P,
        store: BlobStore,
        *,
        run_id: str,
        limits: TransferLimits = DEFAULT_LIMITS,
        accept: Accept | None = None,
        on_submission: OnSubmission | None = None,
        seen: SeenCache | None = None,
    ) -> TransferService:
        """Register the handlers on `p2p` (for a DHT node: `await pulse_dht.replicate_p2p()`)."""
        service = cls(p2p, store, run_id=run_id, limits=limits, accept=accept, on_submission=on_submission, seen=seen)
        await p2p.add_binary_stream_handler(FETCH, service.rpc_fetch)
        await p2p.add_binary_stream_handler(SUBMIT, service.rpc_submit)
        return service

    async def shutdown(self) -> None:
        if self.p2p is None:
            return
        for name in (FETCH, SUBMIT):
            await asyncio.wait_for(self.p2p.remove_binary_stream_handler(name), self.limits.open_timeout)

    async def rpc_fetch(self, info: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve("fetch", self._fetch, info, reader, writer)

    async def rpc_submit(self, info: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve("submit", self._submit, info, reader, writer)

    async def _serve(
        self,
        name: str,
        handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        info: Origin,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        mine = self._per_peer.get(info.peer_id, 0)
        if self.active >= self.limits.max_streams or mine >= self.limits.max_streams_per_peer:
            busy = f"serving {self.active} streams, {mine} of them yours"
            logger.info("%s from %s: BUSY (%s)", name, info.peer_id, busy)
            if name == "submit":
                self.counts.refuse(Status.BUSY)
            await try_reply(writer, Status.BUSY, busy, self.limits)
            await hang_up(reader, writer, timeout=1.0)
            return
        self.active += 1  # counts a stream until it is closed, lingering included
        self._per_peer[info.peer_id] = mine + 1
        try:
            await handler(reader, writer)
        except (ProtocolError, TransferError, TimeoutError, *STREAM_ERRORS) as exc:
            logger.info("%s from %s failed: %s", name, info.peer_id, exc or type(exc).__name__)
        except Exception:  # a bug in this node: log it loudly, but one stream must not take the node down
            logger.exception("%s handler crashed on a stream from %s", name, info.peer_id)
        finally:
            await hang_up(reader, writer, self.limits.open_timeout)
            self.active -= 1
            if (left := self._per_peer.pop(info.peer_id) - 1) > 0:
                self._per_peer[info.peer_id] = left

    async def _fetch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader, self.limits)
        if len(request) != _FETCH_REQUEST.size or request[:1] != b"F":
            await reply(writer, Status.REJECTED, reason="not a fetch request", limits=self.limits)
            raise MalformedPayload("not a fetch request")
        _, raw_sha, max_size = _FETCH_REQUEST.unpack(request)
        sha256 = raw_sha.hex()
        if not self.store.has(sha256):
            await reply(writer, Status.NOT_FOUND, limits=self.limits)
            return
        size = self.store.size(sha256)
        if size > min(max_size, self.limits.max_blob_bytes):
            await reply(writer, Status.TOO_LARGE, reason=f"{size} bytes", limits=self.limits)
            return
        await reply(writer, Status.OK, size=size, limits=self.limits)
        await send_file(writer, self.store.path(sha256), size, self.limits)
        self.counts.served_bytes += size

    async def _submit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            verified = open_signed(await read_request(reader, self.limits), run_id=self.run_id, expect=SubmissionHeader)
        except ProtocolError as exc:
            self.counts.refuse(Status.REJECTED)
            await reply(writer, Status.REJECTED, reason=str(exc), limits=self.limits)
            raise
        status, reason = self._admit(verified)
        if status is not Status.OK:
            self.counts.refuse(status)
            sender = verified.sender_hex[:12]
            logger.info("submission %s... from %s...: %s %s", verified.message_id[:12], sender, status.name, reason)
            await reply(writer, status, reason=reason, limits=self.limits)
            return
        header = verified.message
        self._receiving.add(verified.message_id)
        try:
            await reply(writer, Status.OK, size=header.payload_size, limits=self.limits)
            with self.store.writer(header.payload_sha256, header.payload_size) as blob:
                await receive_body(reader, blob, self.limits)
                await asyncio.get_running_loop().run_in_executor(None, blob.commit)
        except (ProtocolError, TransferError, TimeoutError) as exc:
            self.counts.refuse(Status.FAILED)
            await try_reply(writer, Status.FAILED, str(exc) or "timed out", self.limits)
            raise
        except OSError as exc:  # our disk (full, read-only): the peer is told, the temp file is gone
            self.counts.refuse(Status.FAILED)
            await try_reply(writer, Status.FAILED, f"receiver could not store the payload: {exc}", self.limits)
            raise
        finally:
            self._receiving.discard(verified.message_id)
        # Decide again now that the body is here: the round may have closed while it arrived, or
        # another submission of the same sender may have finished first. Either way this one gets
        # its own logged refusal instead of being dropped (or replacing the first) in silence.
        late = self.accept(header) if self.accept is not None else None
        if late:
            sender, message = verified.sender_hex[:12], verified.message_id[:12]
            logger.info("submission %s... from %s...: REJECTED after its body: %s", message, sender, late)
            self.counts.refuse(Status.REJECTED)
            await reply(writer, Status.REJECTED, reason=late, limits=self.limits)
            return
        self.seen.add(verified.message_id)
        if self.on_submission is not None:
            self.on_submission(verified)
        await reply(writer, Status.OK, size=header.payload_size, limits=self.limits)

    def _admit(self, verified: Verified[SubmissionHeader]) -> tuple[Status, str]:
        """Decide on a verified header before reading its body."""
        if verified.message_id in self.seen:
            return Status.DUPLICATE, "replayed message: already received"
        if verified.message_id in self._receiving:
            return Status.BUSY, "this submission is already being received"
        size = verified.message.payload_size
        if size > self.limits.max_blob_bytes:
            return Status.TOO_LARGE, f"payload of {size} bytes, cap is {self.limits.max_blob_bytes}"
        reason = self.accept(verified.message) if self.accept is not None else None
        return (Status.REJECTED, reason) if reason else (Status.OK, "")
