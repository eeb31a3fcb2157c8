"""`Peer` on the real network: hivemind's DHT for records, libp2p streams for blobs and submissions.

    peer = await P2PPeer.create(net_config, run, identity, folder, role="miner")   # run: a `RunRecords`
    ...
    await peer.shutdown()                      # stops the libp2p daemon and the DHT process

hivemind's DHT API blocks (a pipe to its process), so every DHT call runs in a thread with the
DHT's own timeout; blob transfers are bounded by `TransferLimits`. A node takes pushed
submissions only once its role asks to (`take_submissions`, the validator); until then every push
is refused from its header.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hivemind.p2p import P2P, PeerID

from node.net.blobstore import BlobStore
from node.net.dht import PulseDHT
from node.net.netconfig import NetConfig
from node.net.peer import Peer, Role, RunRecords, RunView
from node.net.transfer import Accept, OnSubmission, TransferCounts, TransferService, call_submit, fetch_from_any
from protocol.errors import ProtocolError, TransferError
from protocol.identity import Identity
from protocol.messages import SubmissionHeader, WireModel
from protocol.signing import SignedMessage, Verified

log = logging.getLogger(__name__)

M = TypeVar("M", bound=WireModel)
T = TypeVar("T")


def refuse_submissions(header: SubmissionHeader) -> str:
    return "this node takes no submissions"


async def _in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking DHT call in a thread (it is bounded by the DHT's own timeout)."""
    return await asyncio.get_running_loop().run_in_executor(None, fn)


class DHTView(RunView):
    """The run's records through a `PulseDHT` alone (no blob streams): what `pulse status` reads."""

    def __init__(self, dht: PulseDHT, run: RunRecords) -> None:
        super().__init__(run)
        self.dht = dht

    async def _get(self, kind: type[M], round_: int) -> list[Verified[M]]:
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
    ) -> None:
        super().__init__(run, identity, store, role)
        self.dht, self.p2p, self.service = dht, p2p, service

    @classmethod
    async def create(
        cls, config: NetConfig, run: RunRecords, identity: Identity, folder: Path, *, role: Role
    ) -> P2PPeer:
        loop = asyncio.get_running_loop()
        dht = await loop.run_in_executor(None, lambda: PulseDHT.start(config, run_id=run.run_id, identity=identity))
        try:
            p2p = await asyncio.wait_for(dht.replicate_p2p(), config.startup_timeout)
            store = BlobStore(folder / "blobs")
            store.clear_partials()
            service = await TransferService.create(p2p, store, run_id=run.run_id, accept=refuse_submissions)
        except BaseException:
            dht.shutdown()
            raise
        return cls(dht, p2p, store, service, run, identity, role)

    @property
    def peer_id(self) -> str:
        return self.dht.peer_id.to_base58()

    async def _get(self, kind: type[M], round_: int) -> list[Verified[M]]:
        return await _in_thread(lambda: self.dht.get(kind, round_))

    async def _store(self, signed: SignedMessage, expiration: float) -> bool:
        return await _in_thread(lambda: self.dht.store_signed(signed, expiration_time=expiration))

    async def _fetch_from(self, holders: list[str], sha256: str, size: int) -> Path:
        peers = [PeerID.from_base58(h) for h in holders]
        try:
            return await fetch_from_any(self.p2p, peers, sha256, self.store, max_size=size)
        except ProtocolError as exc:
            raise TransferError(f"blob {sha256[:12]}... failed its checks: {exc}") from exc

    async def submit(self, signed: SignedMessage, payload: Path, *, to: str | None = None) -> None:
        validator = to or self.validator_peer
        if validator is None:
            raise TransferError("the validator's peer id is unknown")
        await call_submit(self.p2p, PeerID.from_base58(validator), signed, payload)

    def take_submissions(self, accept: Accept, on_submission: OnSubmission) -> None:
        self.service.accept, self.service.on_submission = accept, on_submission

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
