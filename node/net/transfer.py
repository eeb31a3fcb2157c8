"""Blobs over hivemind P2P streams: `rpc_fetch` / `rpc_submit` / `rpc_replicate` handlers and their `call_*` clients.

`fetch` streams a blob this node holds to any peer that asks (so every holder re-serves what it
has); `submit` lets a node that cannot accept connections push a payload to a reachable one: a
miner's submission, or (RL runs) a worker's rollout batch, each under its signed header.

The two conversations (framing and byte pumps are `streams.py`):

    fetch   client: request b"F" | sha256 (32 bytes) | max size u64
            server: reply OK + size (or NOT_FOUND, TOO_LARGE, BUSY), then the body
            (the same stream also serves parts of blobs and link probes: `ranges.py`)
    submit  client: request = a signed `SubmissionHeader` (or `RolloutAnnouncement`) envelope
            server: reply OK (or REJECTED, DUPLICATE, TOO_LARGE, BUSY) before any body byte is sent
            client: the body, exactly the header's `payload_size` (`blob_size`) bytes
            server: reply OK once the blob is verified and stored (or FAILED with the reason)
    replicate  (between a run's validators) client: request = a signed `RoundResult` envelope
            server: reply OK once it holds the blobs the result names (it fetches them from the
            caller, hash-checked), or REJECTED with the reason; a node that takes no replicas
            (every node but a standby validator) refuses before parsing the request

On any failure nothing is stored; a handler logs the peer's failure and never raises.

Serving budgets (`TransferLimits`), so that streams from fresh peer ids and keys cannot stall a
node: a stream's request must arrive within `request_timeout` and only `max_requests` may be
pending at once (a silent stream costs a short, cheap slot; `reserved_requests` of them only for
peers with standing); then a fetch (a whole blob, a range
or a probe alike) takes one of `max_fetch_streams`, `reserved_fetch_streams` of them only for
peers with standing (`budget.Standing`: the validators' peers, holders that delivered a verified
blob, the peers of keys a validator aggregated), and an accepted submission one of
`max_submit_streams`, apart, so a flood of
one kind never blocks the other; `reserved_submit_streams` of those only favoured senders take
(the validator favours miners with a rating history), and a rollout batch one of
`max_rollout_streams`, apart again (`reserved_rollout_streams` for workers whose batches passed);
one signer has one body of each kind in flight; bodies
move at `min_bytes_per_second` or faster, both ways, and a submission's body stops being read (its
slot freed, the sender told why) as soon as its round closes (`Intake.void`). A node takes
submissions only when its transfer service is built with an `Intake`, and rollout batches only once
given a `RolloutTaker` (an RL validator's pool); with neither, every push is refused before its
header is even parsed.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

from hivemind.p2p import P2P, PeerID

from node.net.blobstore import BlobStore, check_sha256
from node.net.budget import ProbeGate, Standing
from node.net.fetching import HolderBook, Progress, fetch_first
from node.net.ranges import Ask, is_ranged, parse_ranged, refuse_ranged, serve_ranged
from node.net.streams import (
    DEFAULT_LIMITS,
    STREAM_ERRORS,
    Status,
    Stream,
    TransferLimits,
    hang_up,
    open_stream,
    printable,
    read_reply,
    read_request,
    receive_body,
    reply,
    send_file,
    send_request,
    try_reply,
)
from protocol.errors import BlobNotFound, MalformedPayload, PeerBusy, ProtocolError, SizeLimitExceeded, TransferError
from protocol.messages import PROTOCOL_VERSION, RolloutAnnouncement, SubmissionHeader
from protocol.signing import SeenCache, SignedMessage, Verified, open_signed

logger = logging.getLogger(__name__)

FETCH = f"pulse/v{PROTOCOL_VERSION}/rpc_fetch"
SUBMIT = f"pulse/v{PROTOCOL_VERSION}/rpc_submit"
REPLICATE = f"pulse/v{PROTOCOL_VERSION}/rpc_replicate"
MAX_REPLICAS_AT_ONCE = 2  # replicas a node fetches at once (one per round in practice)
VOID_CHECK_SECONDS = 0.5  # how often a body on its way asks whether it is still wanted
_FETCH_REQUEST = struct.Struct(">c32sQ")


# -- clients -------------------------------------------------------------------------------------


async def call_fetch(
    p2p: P2P,
    peer: PeerID,
    sha256: str,
    store: BlobStore,
    *,
    max_size: int,
    limits: TransferLimits = DEFAULT_LIMITS,
    on_body: Callable[[Progress], None] | None = None,
) -> Path:
    """Fetch blob `sha256` from `peer` into `store`; its path once verified.

    Raises `BlobNotFound`, `SizeLimitExceeded` (announced size above `max_size`, before any body
    byte is read), `BlobHashMismatch`, `TransferTimeout` or `TransferError`; then nothing is stored.
    """
    check_sha256(sha256)
    if store.has(sha256):
        return store.path(sha256)
    async with open_stream(p2p, peer, FETCH, limits) as stream:
        return await fetch_over(stream, peer, sha256, store, max_size=max_size, limits=limits, on_body=on_body)


async def fetch_over(
    stream: Stream,
    peer: object,
    sha256: str,
    store: BlobStore,
    *,
    max_size: int,
    limits: TransferLimits,
    on_body: Callable[[Progress], None] | None = None,
) -> Path:
    """The client side of a fetch on an open stream (`call_fetch`; the in-memory network uses it too).
    `on_body` gets a probe of the bytes received once the holder starts sending the body."""
    reader, writer = stream
    await send_request(writer, fetch_request(sha256, max_size), limits)
    status, size, reason = await read_reply(reader, limits.open_timeout)
    if status is Status.NOT_FOUND:
        raise BlobNotFound(f"{peer} does not hold blob {sha256[:12]}...")
    if status is Status.BUSY:
        raise PeerBusy(f"{peer} is busy: {reason}")
    if status is not Status.OK:
        raise TransferError(f"{peer} refused to send {sha256[:12]}...: {status.name} {reason}")
    if size > max_size:
        raise SizeLimitExceeded(f"{peer} announced {size} bytes for {sha256[:12]}..., cap is {max_size}")
    with store.writer(sha256, size) as blob:
        if on_body is not None:
            on_body(lambda: blob.written)
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
    book: HolderBook | None = None,
    trusted: Collection[PeerID] = (),
) -> Path:
    """Blob `sha256` from whichever of `peers` delivers first (`fetching.fetch_first`: hedged
    attempts, proven holders first), within one deadline: `fetch_deadline(max_size, limits)`."""
    by_name = {peer.to_base58(): peer for peer in peers}

    def attempt(name: str, on_body: Callable[[Progress], None]) -> Awaitable[Path]:
        return call_fetch(p2p, by_name[name], sha256, store, max_size=max_size, limits=limits, on_body=on_body)

    return await fetch_first(
        list(by_name),
        attempt,
        book=book or HolderBook(),
        sha256=sha256,
        deadline=time.monotonic() + fetch_deadline(max_size, limits),
        hedge_after=limits.hedge_after,
        hedge_rate=limits.hedge_rate,
        trusted={peer.to_base58() for peer in trusted},
    )


def fetch_deadline(size: int, limits: TransferLimits) -> float:
    """Seconds one blob may take in all: opening a few streams, then the body at the minimum rate."""
    return 2 * limits.open_timeout + limits.body_seconds(size)


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
    """The client side of a push on an open stream (`call_submit`; the in-memory network uses it too):
    a signed `SubmissionHeader` or `RolloutAnnouncement` and the file it names."""
    size = pushed_size(signed)
    if payload.stat().st_size != size:
        raise SizeLimitExceeded(f"{payload} is not the {size} bytes its header announces")
    reader, writer = stream
    await send_request(writer, signed.to_bytes(), limits)
    status, _, reason = await read_reply(reader, limits.open_timeout)
    if status is Status.DUPLICATE:
        return False
    if status is Status.BUSY:
        raise PeerBusy(f"{peer} refused the submission: BUSY {reason}")
    if status is not Status.OK:
        raise TransferError(f"{peer} refused the submission: {status.name} {reason}")
    await send_file(writer, payload, size, limits)
    status, _, reason = await read_reply(reader, limits.chunk_timeout)
    if status is not Status.OK:
        raise TransferError(f"{peer} did not store the submission: {status.name} {reason}")
    return True


def pushed_size(signed: SignedMessage) -> int:
    """The body size a push header announces (a submission's payload, a rollout batch's blob)."""
    if signed.kind == RolloutAnnouncement.KIND:
        return RolloutAnnouncement.from_canonical(signed.body).blob_size
    return SubmissionHeader.from_canonical(signed.body).payload_size


async def call_replicate(
    p2p: P2P, peer: PeerID, envelope: bytes, *, wait: float, limits: TransferLimits = DEFAULT_LIMITS
) -> None:
    """Hand a signed round result to the standby validator `peer`; returns once it holds the blobs the
    result names. `TransferError` if it refused, `TimeoutError` past `wait` seconds."""
    async with open_stream(p2p, peer, REPLICATE, limits) as stream:
        await replicate_over(stream, peer, envelope, wait=wait, limits=limits)


async def replicate_over(stream: Stream, peer: object, envelope: bytes, *, wait: float, limits: TransferLimits) -> None:
    """The client side of a replica on an open stream (`call_replicate`; the in-memory network uses it too)."""
    reader, writer = stream
    await send_request(writer, envelope, limits)
    status, _, reason = await read_reply(reader, wait)
    if status is Status.BUSY:
        raise PeerBusy(f"{peer} refused the replica: BUSY {reason}")
    if status is not Status.OK:
        raise TransferError(f"{peer} refused the replica: {status.name} {reason}")


# -- server --------------------------------------------------------------------------------------


class Intake(Protocol):
    """Where pushed submissions go (the validator's round intake, `node/roles/intake.py`), given to
    the transfer service at construction: `rpc_submit` ends in these four calls and nowhere else."""

    @property
    def inbox(self) -> BlobStore:
        """Where pushed payloads land, apart from the blobs this node serves (the intake owns it)."""

    def accept(self, header: SubmissionHeader) -> str | None:
        """Decides on a verified header before its body is read: a rejection reason, or None to accept."""

    def on_submission(self, verified: Verified[SubmissionHeader], path: Path) -> str | None:
        """Takes a received submission, its payload verified and stored at `path` (in the inbox); returns a
        rejection reason if it is refused now that its body is here. The intake removes what it refuses
        or no longer needs (two senders may push the same bytes, so only it knows)."""

    def favoured(self, header: SubmissionHeader) -> bool:
        """Whether a sender may take a reserved submission slot (e.g. it has a rating history)."""

    def void(self, header: SubmissionHeader) -> str | None:
        """Asked while an accepted header's body arrives: why it is no longer wanted (its round has
        closed), or None. A body nobody will read again is not worth a slot until its deadline."""


class RolloutTaker(Protocol):
    """Where pushed rollout batches go (an RL validator's, `node/roles/rl/intake.py`), set on a running
    service (`Peer.take_rollouts`): a rollout push ends in these calls and nowhere else."""

    @property
    def inbox(self) -> BlobStore:
        """Where pushed batches land, apart from the blobs this node serves."""

    def accept(self, verified: Verified[RolloutAnnouncement]) -> str | None:
        """Decides on a verified announcement before its body is read: a rejection reason, or None."""

    def on_rollouts(self, verified: Verified[RolloutAnnouncement], path: Path) -> str | None:
        """Takes a received batch, its bytes verified and stored at `path` (in the inbox); a rejection
        reason if it is refused now that it is here. The taker removes what it refuses."""

    def favoured(self, worker: str) -> bool:
        """Whether a worker may take a reserved upload slot (its batches passed before)."""


@dataclass(frozen=True)
class Push:
    """A verified push header of either kind, seen the one way the stream handles both."""

    verified: Verified[SubmissionHeader] | Verified[RolloutAnnouncement]
    sender: str
    sha256: str
    size: int
    inbox: BlobStore
    accept: Callable[[], str | None]  # before the body: a rejection reason, or None
    favoured: bool
    land: Callable[[Path], str | None]  # the body is stored at this path: a rejection reason, or None
    void: Callable[[], str | None] = lambda: None  # while the body arrives: why it is no longer wanted

    @property
    def what(self) -> str:
        return ROLLOUTS if isinstance(self.verified.message, RolloutAnnouncement) else "submission"


class Voided(Exception):
    """A body stopped while it arrived: the taker no longer wants it (the reason is the message)."""


async def _unless_void(body: Awaitable[None], void: Callable[[], str | None]) -> None:
    """Await `body`, asking `void` every `VOID_CHECK_SECONDS`; a reason cancels it and raises `Voided`."""
    task = asyncio.ensure_future(body)
    try:
        while not (await asyncio.wait({task}, timeout=VOID_CHECK_SECONDS))[0]:
            if (reason := void()) is not None:
                raise Voided(reason)
        task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def submission_push(verified: Verified[SubmissionHeader], intake: Intake) -> Push:
    header = verified.message
    return Push(
        verified,
        header.sender,
        header.payload_sha256,
        header.payload_size,
        intake.inbox,
        lambda: intake.accept(header),
        intake.favoured(header),
        lambda path: intake.on_submission(verified, path),
        lambda: intake.void(header),
    )


def rollout_push(verified: Verified[RolloutAnnouncement], taker: RolloutTaker) -> Push:
    a, worker = verified.message, verified.sender_hex
    return Push(
        verified,
        worker,
        a.blob_sha256,
        a.blob_size,
        taker.inbox,
        lambda: taker.accept(verified),
        taker.favoured(worker),
        lambda path: taker.on_rollouts(verified, path),
    )


@dataclass(frozen=True)
class Handlers:
    """An `Intake` made of three functions and a folder (tools and tests)."""

    inbox: BlobStore
    accept: Callable[[SubmissionHeader], str | None]
    on_submission: Callable[[Verified[SubmissionHeader], Path], str | None]
    favoured: Callable[[SubmissionHeader], bool] = lambda header: False
    void: Callable[[SubmissionHeader], str | None] = lambda header: None


ROLLOUTS = "rollout batch"
NO_SUBMISSIONS = "this node takes no submissions"
NO_ROLLOUTS = "this node takes no rollout batches (only an RL run's validator does)"
OnReplica = Callable[[str, bytes], Awaitable[str | None]]
"""Takes a pushed replica (the caller's peer id in base58, the request: a signed round result's
envelope, unchecked); None once it holds the blobs the result names, else the reason it refuses.
It must bound its own time (its fetches have deadlines) and change nothing when it refuses."""
NO_REPLICAS = "this node takes no replicas (only a standby validator does)"


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


class Slots:
    """A budget of concurrent streams, `reserved` of them (at most half) for favoured callers: half
    stays open to anyone, so a node whose callers have no standing yet (a new run) still serves."""

    def __init__(self, size: int, reserved: int = 0) -> None:
        self.size, self.reserved, self.used = size, min(reserved, size // 2), 0

    def take(self, favoured: bool = False) -> bool:
        if self.used >= self.size - (0 if favoured else self.reserved):
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used -= 1


class TransferService:
    """Serves this node's blob store to peers and receives pushed submissions. Never raises on peer input."""

    def __init__(
        self,
        p2p: P2P | None,  # None: served in process (the in-memory network opens the streams)
        store: BlobStore,
        *,
        run_id: str,
        limits: TransferLimits = DEFAULT_LIMITS,
        intake: Intake | None = None,
        seen: SeenCache | None = None,
    ) -> None:
        """`intake`: where pushed submissions go (None: every push is refused from its header). Its
        inbox is apart from the blobs this node serves: a payload whose bytes equal a served blob (a
        patch is public) must never replace or remove it."""
        self.p2p, self.store, self.run_id, self.limits = p2p, store, run_id, limits
        self.on_replica: OnReplica | None = None  # a standby validator's (`take_replicas`)
        self.rollouts: RolloutTaker | None = None  # an RL validator's pool (`take_rollouts`)
        self.replicas = Slots(MAX_REPLICAS_AT_ONCE)
        self.intake = intake
        self.seen = seen if seen is not None else SeenCache()  # pass a persisted one to survive restarts
        self.active = 0  # streams being served, from the first byte to the hang-up
        self._per_peer: dict[object, int] = {}  # open streams by peer: one peer cannot take every slot
        self.requests = Slots(limits.max_requests, limits.reserved_requests)
        self.fetches = Slots(limits.max_fetch_streams, limits.reserved_fetch_streams)
        self.submits = Slots(limits.max_submit_streams, limits.reserved_submit_streams)
        self.rollout_slots = Slots(limits.max_rollout_streams, limits.reserved_rollout_streams)
        self._receiving: set[str] = set()  # message ids whose body is arriving
        self._senders: set[tuple[str, str]] = set()  # (kind, signer) with a body arriving: one each
        self.counts = TransferCounts()

    @classmethod
    async def create(
        cls,
        p2p: P2P,
        store: BlobStore,
        *,
        run_id: str,
        limits: TransferLimits = DEFAULT_LIMITS,
        intake: Intake | None = None,
        seen: SeenCache | None = None,
    ) -> TransferService:
        """Register the handlers on `p2p` (for a DHT node: `await pulse_dht.replicate_p2p()`)."""
        service = cls(p2p, store, run_id=run_id, limits=limits, intake=intake, seen=seen)
        await service.serve_on(p2p)
        return service

    async def serve_on(self, p2p: P2P) -> None:
        """Serve on `p2p` (again, after the DHT process and its daemon were restarted)."""
        self.p2p = p2p
        await p2p.add_binary_stream_handler(FETCH, self.rpc_fetch)
        await p2p.add_binary_stream_handler(SUBMIT, self.rpc_submit)
        await p2p.add_binary_stream_handler(REPLICATE, self.rpc_replicate)

    def handler(self, name: str) -> Callable[[Origin, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        """The handler of protocol `name` (the in-memory network dispatches by it)."""
        return {FETCH: self.rpc_fetch, SUBMIT: self.rpc_submit, REPLICATE: self.rpc_replicate}[name]

    async def shutdown(self) -> None:
        if self.p2p is None:
            return
        for name in (FETCH, SUBMIT, REPLICATE):
            await asyncio.wait_for(self.p2p.remove_binary_stream_handler(name), self.limits.open_timeout)

    @cached_property
    def standing(self) -> Standing:
        """Peers that may take the reserved send slots (`budget.py`; the node's `Peer` grants them)."""
        return Standing()

    @cached_property
    def probes(self) -> ProbeGate:
        """What link probes may cost this node (`ranges.py`)."""
        return ProbeGate(self.limits.probes_per_key_per_minute, self.limits.unknown_probe_bytes_per_second)

    async def rpc_fetch(self, info: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        standing = info.peer_id in self.standing

        async def fetch(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._fetch(request, reader, writer, standing=standing)

        await self._serve("fetch", fetch, info, reader, writer)

    async def rpc_submit(self, info: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve("submit", self._submit, info, reader, writer)

    async def rpc_replicate(self, info: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        origin = info.peer_id
        name = origin.to_base58() if hasattr(origin, "to_base58") else str(origin)

        async def replicate(request: bytes, _: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
            await self._replicate(name, request, out)

        await self._serve("replicate", replicate, info, reader, writer)

    async def _serve(
        self,
        name: str,
        handler: Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        info: Origin,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        mine = self._per_peer.get(info.peer_id, 0)
        if mine >= self.limits.max_streams_per_peer or not self.requests.take(info.peer_id in self.standing):
            busy = f"{self.requests.used} requests pending, {mine} streams yours"
            logger.info("%s from %s: BUSY (%s)", name, info.peer_id, busy)
            if name == "submit":
                self.counts.refuse(Status.BUSY)
            await try_reply(writer, Status.BUSY, busy, self.limits)
            await hang_up(reader, writer, timeout=1.0)
            return
        self.active += 1
        self._per_peer[info.peer_id] = mine + 1
        linger = self.limits.request_timeout  # let our last reply flush before the stream closes
        try:
            try:
                request = await read_request(reader, self.limits)
            except BaseException:
                linger = 0.0  # a silent or broken request: nothing of ours to flush, hang up now
                raise
            finally:
                self.requests.give()
            await handler(request, reader, writer)
        except (ProtocolError, TransferError, TimeoutError, *STREAM_ERRORS) as exc:
            logger.info("%s from %s failed: %s", name, info.peer_id, printable(str(exc)) or type(exc).__name__)
        except Exception:  # a bug in this node: log it loudly, but one stream must not take the node down
            logger.exception("%s handler crashed on a stream from %s", name, info.peer_id)
        finally:
            await hang_up(reader, writer, linger)
            self.active -= 1
            if (left := self._per_peer.pop(info.peer_id) - 1) > 0:
                self._per_peer[info.peer_id] = left

    async def _fetch(
        self, request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, standing: bool
    ) -> None:
        """Whole blobs, ranges and probes alike: checked, then a send slot (`reserved_fetch_streams`
        of them for peers with standing), then the body within its overall deadline."""
        if is_ranged(request):  # a part of a blob, or a link probe (`ranges.py`)
            await self._fetch_ranged(request, reader, writer, standing=standing)
            return
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
        if not await self._take_send_slot(writer, standing):
            return
        try:
            await reply(writer, Status.OK, size=size, limits=self.limits)
            await send_file(writer, self.store.path(sha256), size, self.limits)
            self.counts.served_bytes += size
        finally:
            self.fetches.give()

    async def _fetch_ranged(
        self, request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, standing: bool
    ) -> None:
        try:
            ask = parse_ranged(request, self.run_id)
        except ProtocolError as exc:
            await reply(writer, Status.REJECTED, reason=str(exc), limits=self.limits)
            raise
        if await refuse_ranged(self.store, ask, writer, self.limits):
            return
        if (refusal := self._probe_refusal(ask, standing)) is not None:
            await reply(writer, Status.BUSY, reason=refusal, limits=self.limits)
            return
        if not await self._take_send_slot(writer, standing):
            return
        try:
            self.counts.served_bytes += await serve_ranged(self.store, ask, reader, writer, self.limits)
        finally:
            self.fetches.give()

    def _probe_refusal(self, ask: Ask, standing: bool) -> str | None:
        return None if ask.kind == b"R" else self.probes.admit(ask.signer, ask.length, standing=standing)

    async def _take_send_slot(self, writer: asyncio.StreamWriter, standing: bool) -> bool:
        """A send slot, or a BUSY reply (False)."""
        if self.fetches.take(standing):
            return True
        await reply(writer, Status.BUSY, reason=f"sending {self.fetches.used} blobs", limits=self.limits)
        return False

    async def _replicate(self, origin: str, request: bytes, writer: asyncio.StreamWriter) -> None:
        if self.on_replica is None:
            await reply(writer, Status.REJECTED, reason=NO_REPLICAS, limits=self.limits)
            return
        if not self.replicas.take():
            await reply(writer, Status.BUSY, reason=f"taking {self.replicas.used} replicas", limits=self.limits)
            return
        try:
            refusal = await self.on_replica(origin, request)
        finally:
            self.replicas.give()
        if refusal is not None:
            logger.info("replica from %s: REJECTED %s", origin, printable(refusal))
            await reply(writer, Status.REJECTED, reason=refusal, limits=self.limits)
            return
        await reply(writer, Status.OK, limits=self.limits)

    async def _submit(self, request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.intake is None and self.rollouts is None:  # takes no pushes: refused before the header is parsed
            self.counts.refuse(Status.REJECTED)
            await reply(writer, Status.REJECTED, reason=NO_SUBMISSIONS, limits=self.limits)
            return
        try:
            push = self._push_of(request)
        except ProtocolError as exc:
            self.counts.refuse(Status.REJECTED)
            await reply(writer, Status.REJECTED, reason=str(exc), limits=self.limits)
            raise
        status, reason = self._admit(push)
        slots = self.rollout_slots if push.what == ROLLOUTS else self.submits
        if status is Status.OK and not slots.take(push.favoured):
            status, reason = Status.BUSY, f"receiving {slots.used} {push.what}s; try again shortly"
        if status is not Status.OK:
            self.counts.refuse(status)
            message, sender = push.verified.message_id[:12], push.sender[:12]
            logger.info("%s %s... from %s...: %s %s", push.what, message, sender, status.name, reason)
            await reply(writer, status, reason=reason, limits=self.limits)
            return
        try:
            await self._receive(push, reader, writer)
        finally:
            slots.give()

    def _push_of(self, request: bytes) -> Push:
        """The verified header of a push this node takes; `ProtocolError` for any other."""
        signed = SignedMessage.from_bytes(request)
        if signed.kind == RolloutAnnouncement.KIND:
            if self.rollouts is None:
                raise ProtocolError(NO_ROLLOUTS)
            return rollout_push(open_signed(request, run_id=self.run_id, expect=RolloutAnnouncement), self.rollouts)
        if self.intake is None:
            raise ProtocolError(NO_SUBMISSIONS)
        return submission_push(open_signed(request, run_id=self.run_id, expect=SubmissionHeader), self.intake)

    async def _receive(self, push: Push, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        message_id, sender = push.verified.message_id, (push.what, push.sender)
        self._receiving.add(message_id)
        self._senders.add(sender)
        try:
            await reply(writer, Status.OK, size=push.size, limits=self.limits)
            with push.inbox.writer(push.sha256, push.size) as blob:
                await _unless_void(receive_body(reader, blob, self.limits), push.void)
                path = await asyncio.get_running_loop().run_in_executor(None, blob.commit)
        except Voided as exc:  # e.g. its round closed: the slot is free now, not at the body's deadline
            logger.info(
                "%s %s... from %s...: REJECTED while its body arrived: %s",
                push.what,
                message_id[:12],
                sender[1][:12],
                exc,
            )
            self.counts.refuse(Status.REJECTED)
            await try_reply(writer, Status.REJECTED, str(exc), self.limits)
            return
        except (ProtocolError, TransferError, TimeoutError) as exc:
            self.counts.refuse(Status.FAILED)
            await try_reply(writer, Status.FAILED, str(exc) or "timed out", self.limits)
            raise
        except OSError as exc:  # our disk (full, read-only): the peer is told, the temp file is gone
            self.counts.refuse(Status.FAILED)
            await try_reply(writer, Status.FAILED, f"receiver could not store the payload: {exc}", self.limits)
            raise
        finally:
            self._receiving.discard(message_id)
            self._senders.discard(sender)
        # The taker decides again now that the body is here: the round may have closed while it
        # arrived, or another push of the same sender may have finished first. Either way
        # this one gets its own logged refusal instead of being dropped (or replacing the first)
        # in silence, and the taker removes its payload.
        late = push.land(path)
        if late:
            logger.info(
                "%s %s... from %s...: REJECTED after its body: %s", push.what, message_id[:12], sender[1][:12], late
            )
            self.counts.refuse(Status.REJECTED)
            await reply(writer, Status.REJECTED, reason=late, limits=self.limits)
            return
        self.seen.add(message_id)
        await reply(writer, Status.OK, size=push.size, limits=self.limits)

    def _admit(self, push: Push) -> tuple[Status, str]:
        """Decide on a verified header before reading its body."""
        if push.verified.message_id in self.seen:
            return Status.DUPLICATE, "replayed message: already received"
        if push.verified.message_id in self._receiving:
            return Status.BUSY, f"this {push.what} is already being received"
        if (push.what, push.sender) in self._senders:
            return Status.BUSY, f"a {push.what} of this key is already arriving"
        if push.size > self.limits.max_blob_bytes:
            return Status.TOO_LARGE, f"payload of {push.size} bytes, cap is {self.limits.max_blob_bytes}"
        reason = push.accept()
        return (Status.REJECTED, reason) if reason else (Status.OK, "")
