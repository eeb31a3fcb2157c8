"""`Peer` on the real network: hivemind's DHT for records, libp2p streams for blobs and submissions.

    peer = await P2PPeer.create(net_config, run, identity, folder, role="miner")   # run: a `RunRecords`
    peer = await P2PPeer.create(net_config, run, identity, folder, role="validator", intake=intake)
    ...
    await peer.shutdown()                      # stops the libp2p daemon and the DHT process

hivemind's DHT API blocks (a pipe to its process), so every DHT call runs in a thread with the
DHT's own timeout; blob transfers are bounded by `TransferLimits`. A node takes pushed
submissions only when it is created with an `Intake` (the validator's, `node/roles/intake.py`);
without one every push is refused from its header.

If hivemind's DHT process dies (it takes its libp2p daemon with it), the next call notices: a new
DHT process starts on the same options, the blob service is registered on its daemon again, and
the call is made once more. The peer id changes unless the net config names an identity file;
the next heartbeat announces the new one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TypeVar

from hivemind.p2p import P2P, PeerID

from node.net.blobstore import BlobStore
from node.net.dht import PulseDHT
from node.net.fetching import Progress
from node.net.netconfig import NetConfig
from node.net.peer import Peer, Role, RunRecords, RunView
from node.net.streams import DEFAULT_LIMITS, Stream, TransferLimits, open_stream
from node.net.transfer import (
    FETCH,
    Intake,
    TransferCounts,
    TransferService,
    call_fetch,
    call_replicate,
    call_submit,
)
from protocol.errors import NetworkError, ProtocolError, TransferError
from protocol.identity import Identity
from protocol.messages import WireModel
from protocol.signing import SignedMessage, Verified

log = logging.getLogger(__name__)

M = TypeVar("M", bound=WireModel)
T = TypeVar("T")


async def _in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking DHT call in a thread (it is bounded by the DHT's own timeout)."""
    return await asyncio.get_running_loop().run_in_executor(None, fn)


class DHTView(RunView):
    """The run's records through a `PulseDHT` alone (no blob streams): what `pulse status` and
    `pulse dashboard` read. A DHT process that died is restarted before the next read."""

    def __init__(self, dht: PulseDHT, run: RunRecords) -> None:
        super().__init__(run)
        self.dht = dht

    async def _get(self, kind: type[M], round_: int) -> list[Verified[M]]:
        if not self.dht.alive:
            await _in_thread(self.dht.restart)
        return await _in_thread(lambda: self.dht.get(kind, round_))


class P2PPeer(Peer):
    def __init__(
        self,
        dht: PulseDHT,
        p2p: P2P,
        store: BlobStore,
        service: TransferService,
        run: RunRecords,
        identity: Identity,
        role: Role,
        limits: TransferLimits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__(run, identity, store, role, limits)
        self.dht, self.p2p, self.service = dht, p2p, service
        self._restarting = asyncio.Lock()

    @classmethod
    async def create(
        cls,
        config: NetConfig,
        run: RunRecords,
        identity: Identity,
        folder: Path,
        *,
        role: Role,
        intake: Intake | None = None,
    ) -> P2PPeer:
        """`intake`: where pushed submissions go (the validator's); None refuses every push."""
        loop = asyncio.get_running_loop()
        dht = await loop.run_in_executor(None, lambda: PulseDHT.start(config, run.rules(), identity))
        try:
            p2p = await asyncio.wait_for(dht.replicate_p2p(), config.startup_timeout)
            store = BlobStore(folder / "blobs")
            store.clear_partials()
            service = await TransferService.create(p2p, store, run_id=run.run_id, intake=intake)
        except BaseException:
            dht.shutdown()
            raise
        peer = cls(dht, p2p, store, service, run, identity, role)
        peer.alone = not config.initial_peers
        return peer

    @property
    def peer_id(self) -> str:
        return self.dht.peer_id.to_base58()

    async def _get(self, kind: type[M], round_: int) -> list[Verified[M]]:
        return await self._dht_call(lambda: self.dht.get(kind, round_, self.has_standing))

    async def _store(self, signed: SignedMessage) -> bool:
        return await self._dht_call(lambda: self.dht.store_signed(signed).published)

    async def _dht_call(self, call: Callable[[], T]) -> T:
        """`call` in a thread; if the DHT process died, restart it and make the call once more."""
        if not self.dht.alive:
            await self.restart()
        try:
            return await _in_thread(call)
        except NetworkError:
            if self.dht.alive:
                raise
            await self.restart()
            return await _in_thread(call)

    async def restart(self) -> None:
        """A new DHT process and libp2p daemon, with the blob service registered on it again."""
        async with self._restarting:
            if self.dht.alive:
                return  # another call restarted it meanwhile
            await _in_thread(self.dht.restart)
            self.p2p = await asyncio.wait_for(self.dht.replicate_p2p(), self.dht.config.startup_timeout)
            await self.service.serve_on(self.p2p)
            log.warning("DHT restarted: peer id %s", self.peer_id)

    async def _fetch_one(self, holder: str, sha256: str, size: int, on_body: Callable[[Progress], None]) -> Path:
        try:
            peer = PeerID.from_base58(holder)
            return await call_fetch(
                self.p2p, peer, sha256, self.store, max_size=size, limits=self.limits, on_body=on_body
            )
        except ProtocolError as exc:
            raise TransferError(f"blob {sha256[:12]}... failed its checks: {exc}") from exc

    def _open_fetch(self, holder: str) -> AbstractAsyncContextManager[Stream]:
        return open_stream(self.p2p, PeerID.from_base58(holder), FETCH, self.limits)

    async def _submit_to(self, validator: str, signed: SignedMessage, payload: Path) -> None:
        await call_submit(self.p2p, PeerID.from_base58(validator), signed, payload, limits=self.limits)

    async def _replicate_to(self, validator: str, envelope: bytes, wait: float) -> None:
        await call_replicate(self.p2p, PeerID.from_base58(validator), envelope, wait=wait, limits=self.limits)

    def known_peers(self) -> int:
        return self.dht.known_peers()

    def transfer_counts(self) -> TransferCounts:
        return self.service.counts

    async def shutdown(self) -> None:
        try:
            await asyncio.wait_for(self.service.shutdown(), 10.0)
        except (TimeoutError, Exception) as exc:  # the daemon may already be gone on Ctrl+C
            log.debug("transfer service shutdown: %s", exc)
        await asyncio.get_running_loop().run_in_executor(None, self.dht.shutdown)
