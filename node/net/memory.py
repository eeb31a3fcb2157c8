"""`Peer` on an in-process network: whole rounds of real roles in one event loop, for the fast test tier.

    network = MemoryNetwork(run)                         # run: a `RunRecords`
    peer = network.join(identity, folder, role="miner")  # a `Peer`, its blobs in folder/blobs
    peer = network.join(identity, folder, role="validator", intake=intake)  # takes pushed submissions
    ...
    await network.shutdown()

What stays real: every record is checked on store and on read by the DHT's own record validator
(`dht.verify_record`: signature, owner subkey, run, key, kind policy, signed expiration), kept
within the same `StoreBudget` a hivemind peer applies (`records.py`), replaced only by a newer
record of its owner, and read in the same order (`RecordRules.read_order`); blobs and submissions
travel through `transfer.py`'s own handlers and client conversations (`TransferService`,
`fetch_over`, `submit_over`) over in-memory streams, so framing, size caps, hash checks, BUSY slots
and the validator's admission are the ones libp2p peers run. What is simulated: the DHT is one
dictionary (every peer sees every record at once), a stream is a pair of `asyncio.StreamReader`s,
and a peer's uplink (`uplink[peer_id]`, bytes/s) slows what it serves, for tests of fetch plans.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from hashlib import sha256 as sha256_of
from pathlib import Path
from typing import TypeVar

from node.net.blobstore import BlobStore
from node.net.dht import PulseRecordValidator, check_store, dht_key_id, verify_record
from node.net.fetching import Progress
from node.net.peer import Peer, Role, RunRecords
from node.net.records import StoreBudget, no_standing
from node.net.streams import DEFAULT_LIMITS, Stream, TransferLimits, guarded_stream
from node.net.transfer import (
    FETCH,
    REPLICATE,
    SUBMIT,
    Intake,
    TransferCounts,
    TransferService,
    fetch_over,
    replicate_over,
    submit_over,
)
from protocol.errors import NetworkError, ProtocolError
from protocol.identity import Identity
from protocol.messages import WireModel
from protocol.signing import SignedMessage, Verified

log = logging.getLogger(__name__)

M = TypeVar("M", bound=WireModel)
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def memory_peer_id(identity: Identity, n: int) -> str:
    """A base58 address (the shape heartbeats require) naming the `n`-th peer that joined with `identity`."""
    value = int.from_bytes(sha256_of(bytes.fromhex(identity.public_hex) + n.to_bytes(4, "big")).digest(), "big")
    digits = []
    while value:
        value, rest = divmod(value, 58)
        digits.append(_BASE58[rest])
    return "Mem" + "".join(reversed(digits))


class _Uplink:
    """A peer's uplink at `rate` bytes/s, shared by every stream it serves: bytes queue for it."""

    def __init__(self, rate: float) -> None:
        self.rate, self.free_at = rate, 0.0

    async def send(self, nbytes: int) -> None:
        now = time.monotonic()
        self.free_at = max(now, self.free_at) + nbytes / self.rate
        await asyncio.sleep(self.free_at - now)


class _PipeWriter:
    """The parts of `asyncio.StreamWriter` the transfer code uses, writing into the other end's reader.
    Over an `uplink`, what is written reaches the other end in `drain`, `_SLICE` bytes at a time,
    each once the link has carried it."""

    _SLICE = 64 * 1024

    def __init__(self, other_end: asyncio.StreamReader, uplink: _Uplink | None = None) -> None:
        self.other_end, self.closed, self.uplink = other_end, False, uplink
        self.pending = bytearray()

    def write(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionResetError("write on a closed in-memory stream")
        if self.uplink is None:
            self.other_end.feed_data(bytes(data))
        else:
            self.pending += data

    async def drain(self) -> None:
        while self.pending and not self.closed and self.uplink is not None:
            piece = bytes(self.pending[: self._SLICE])
            del self.pending[: self._SLICE]
            await self.uplink.send(len(piece))
            self.other_end.feed_data(piece)
        await asyncio.sleep(0)  # let the other end run, as a socket buffer would

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.other_end.feed_data(bytes(self.pending))  # what was written still arrives
            self.other_end.feed_eof()


def _pipe(client: _Uplink | None = None, server: _Uplink | None = None) -> tuple[Stream, Stream]:
    """Two connected ends: what one writes, the other reads, each sending over its uplink."""
    a, b = asyncio.StreamReader(), asyncio.StreamReader()
    return (a, _PipeWriter(b, client)), (b, _PipeWriter(a, server))  # type: ignore[return-value]


@dataclass(frozen=True)
class _Origin:
    peer_id: str


@dataclass
class _Record:
    envelope: bytes
    expiration: float


class MemoryNetwork:
    """Records of one run and the peers that joined, in this process."""

    def __init__(self, run: RunRecords, limits: TransferLimits = DEFAULT_LIMITS) -> None:
        self.run, self.limits = run, limits
        self.rules = run.rules()
        self.validator = PulseRecordValidator(self.rules)
        self.budget = StoreBudget(self.rules)
        self.records: dict[tuple[str, int], dict[bytes, _Record]] = {}  # (kind, round) -> owner -> record
        self._keys: dict[bytes, tuple[str, int]] = {}  # hashed DHT key -> (kind, round)
        self.peers: dict[str, MemoryPeer] = {}
        self.uplink: dict[str, float] = {}  # peer id -> bytes/s its streams share, both ways (default: no limit)
        self._uplinks: dict[str, _Uplink] = {}
        self._joined = 0
        self._served: set[asyncio.Task[None]] = set()

    def join(self, identity: Identity, folder: Path, *, role: Role, intake: Intake | None = None) -> MemoryPeer:
        """A peer with its blobs in folder/blobs; `intake`: where pushed submissions go (the validator's)."""
        store = BlobStore(folder / "blobs")
        store.clear_partials()
        self._joined += 1
        peer = MemoryPeer(self, memory_peer_id(identity, self._joined), store, identity, role, intake)
        self.peers[peer.peer_id] = peer
        return peer

    def leave(self, peer: MemoryPeer) -> None:
        self.peers.pop(peer.peer_id, None)

    def store(self, signed: SignedMessage) -> bool:
        """Check the record as a DHT peer would, keep it within the peer's budget, and of two
        records of one owner keep the newer signed one (the later signed expiry), as hivemind does."""
        try:
            check_store(self.validator, signed)
        except ProtocolError as exc:
            log.debug("record refused: %s", exc)
            return False
        slot = self.records.setdefault((signed.kind, signed.round), {})
        old = slot.get(signed.sender)
        if old is not None and old.expiration > time.time():
            if signed.expires_at <= old.expiration:
                return False
        else:
            key = dht_key_id(self.run.run_id, signed.kind, signed.round)
            self._keys[key] = (signed.kind, signed.round)
            admission = self.budget.admit(key, signed.sender, signed.to_bytes(), signed.expires_at)
            if not admission.stored:
                log.debug("record refused: %s", admission.reason)
                return False
            for evicted in admission.evict:
                self._drop(*evicted)
        slot[signed.sender] = _Record(signed.to_bytes(), signed.expires_at)
        return True

    def _drop(self, key: bytes, owner: bytes) -> None:
        self.records.get(self._keys.get(key, ("", -1)), {}).pop(owner, None)

    def get(
        self, kind: type[M], round_: int, *, salt: bytes = b"", preferred: Callable[[bytes], bool] = no_standing
    ) -> list[Verified[M]]:
        """The live `kind` records of `round_`, re-verified as a reader does, in `read_order`."""
        now, out = time.time(), []
        slot = self.records.get((kind.KIND, round_), {})
        for owner in self.rules.read_order(list(slot), kind.KIND, salt=salt, preferred=preferred):
            record = slot[owner]
            if record.expiration <= now:
                continue
            try:
                out.append(verify_record(self.validator, kind, round_, owner, record.envelope, record.expiration))
            except ProtocolError as exc:
                log.warning("ignored a %s record that failed local checks: %s", kind.KIND, exc)
        return out

    @asynccontextmanager
    async def open(self, caller: str, callee: str, name: str) -> AsyncIterator[Stream]:
        """A stream from `caller` to `callee`'s handler `name`, served by its `TransferService`."""

        async def opening() -> Stream:
            target = self.peers.get(callee)
            if target is None:
                raise ConnectionRefusedError(f"no peer {callee} on the in-memory network")
            client, server = _pipe(self._uplink(caller), self._uplink(callee))
            task = asyncio.ensure_future(target.service.handler(name)(_Origin(caller), *server))
            self._served.add(task)
            task.add_done_callback(self._served.discard)
            return client

        async with guarded_stream(opening(), callee, self.limits) as stream:
            yield stream

    def _uplink(self, peer_id: str) -> _Uplink | None:
        rate = self.uplink.get(peer_id)
        if rate is None:
            return None
        link = self._uplinks.get(peer_id)
        if link is None or link.rate != rate:
            link = self._uplinks[peer_id] = _Uplink(rate)
        return link

    async def shutdown(self) -> None:
        """Wait (bounded) for streams still being served, then forget every peer."""
        if self._served:
            await asyncio.wait(set(self._served), timeout=self.limits.open_timeout)
        self.peers.clear()


class MemoryPeer(Peer):
    def __init__(
        self,
        network: MemoryNetwork,
        peer_id: str,
        store: BlobStore,
        identity: Identity,
        role: Role,
        intake: Intake | None = None,
    ) -> None:
        super().__init__(network.run, identity, store, role, network.limits)
        self.network, self._peer_id = network, peer_id
        self._salt = os.urandom(16)  # this reader's order of the signers it does not prefer (`read_order`)
        self.service = TransferService(None, store, run_id=network.run.run_id, limits=network.limits, intake=intake)

    @property
    def peer_id(self) -> str:
        return self._peer_id

    async def _get(self, kind: type[M], round_: int) -> list[Verified[M]]:
        if self.peer_id not in self.network.peers:
            raise NetworkError("this peer has left the network")
        return self.network.get(kind, round_, salt=self._salt, preferred=self.has_standing)

    async def _store(self, signed: SignedMessage) -> bool:
        return self.peer_id in self.network.peers and self.network.store(signed)

    async def _fetch_one(self, holder: str, sha256: str, size: int, on_body: Callable[[Progress], None]) -> Path:
        async with self.network.open(self.peer_id, holder, FETCH) as stream:
            return await fetch_over(
                stream, holder, sha256, self.store, max_size=size, limits=self.limits, on_body=on_body
            )

    def _open_fetch(self, holder: str) -> AbstractAsyncContextManager[Stream]:
        return self.network.open(self.peer_id, holder, FETCH)

    async def _submit_to(self, validator: str, signed: SignedMessage, payload: Path) -> None:
        async with self.network.open(self.peer_id, validator, SUBMIT) as stream:
            await submit_over(stream, validator, signed, payload, limits=self.limits)

    async def _replicate_to(self, validator: str, envelope: bytes, wait: float) -> None:
        async with self.network.open(self.peer_id, validator, REPLICATE) as stream:
            await replicate_over(stream, validator, envelope, wait=wait, limits=self.limits)

    def known_peers(self) -> int:
        return max(len(self.network.peers) - 1, 0)  # every other peer that joined and has not left

    def transfer_counts(self) -> TransferCounts:
        return self.service.counts

    async def shutdown(self) -> None:
        self.network.leave(self)
