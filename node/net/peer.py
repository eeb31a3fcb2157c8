"""One running node on the network: DHT records, blob serving and fetching, all awaitable.

    peer = await Peer.create(net_config, run, identity, folder, role="miner")   # run: a `RunRecords`
    result = await peer.round_result(r)        # the validator's signed verdict for round r, or None
    path = await peer.fetch(sha256, size, r)   # from the validator or any peer whose heartbeat lists it
    await peer.heartbeat(r, state_hash)        # "alive at round r, serving these blobs"
    await peer.shutdown()

hivemind's DHT API blocks (a pipe to its process), so every DHT call runs in a thread with the
DHT's own timeout; blob transfers are bounded by `TransferLimits`. Only records signed by one of
the run's validator keys count as round results and checkpoints.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from hivemind.p2p import P2P, PeerID

from node.net.blobstore import BlobStore
from node.net.dht import PulseDHT
from node.net.netconfig import NetConfig
from node.net.transfer import Accept, OnSubmission, TransferService, fetch_from_any
from protocol.errors import NetworkError, ProtocolError, TransferError
from protocol.identity import Identity
from protocol.messages import MAX_HELD_BLOBS, CheckpointAnnouncement, Heartbeat, RoundResult, WireModel
from protocol.signing import SignedMessage, Verified

log = logging.getLogger(__name__)

M = TypeVar("M", bound=WireModel)
T = TypeVar("T")
Role = Literal["bootstrap", "miner", "validator", "follower"]
PUBLISH_RETRY_SECONDS = (1.0, 2.0)


@dataclass(frozen=True)
class RunRecords:
    """What the network layer needs to know of a run (the roles make it from the manifest)."""

    run_id: str
    validators: frozenset[str]  # public keys (hex) whose round results and checkpoints count
    record_ttl_seconds: float  # how long this node's DHT records live
    checkpoint_every: int  # how far back the newest checkpoint can be


class Peer:
    def __init__(
        self, dht: PulseDHT, p2p: P2P, store: BlobStore, service: TransferService, run: RunRecords, role: Role
    ) -> None:
        self.dht, self.p2p, self.store, self.service = dht, p2p, store, service
        self.run, self.role = run, role
        self.run_id = run.run_id
        self.validators = run.validators
        self.held: list[str] = []  # blobs announced in heartbeats, newest last
        self.validator_peer: PeerID | None = None

    @classmethod
    async def create(
        cls,
        config: NetConfig,
        run: RunRecords,
        identity: Identity,
        folder: Path,
        *,
        role: Role,
        accept: Accept | None = None,
        on_submission: OnSubmission | None = None,
    ) -> Peer:
        loop = asyncio.get_running_loop()
        dht = await loop.run_in_executor(None, lambda: PulseDHT.start(config, run_id=run.run_id, identity=identity))
        try:
            p2p = await asyncio.wait_for(dht.replicate_p2p(), config.startup_timeout)
            store = BlobStore(folder / "blobs")
            store.clear_partials()
            service = await TransferService.create(
                p2p, store, run_id=run.run_id, accept=accept, on_submission=on_submission
            )
        except BaseException:
            dht.shutdown()
            raise
        return cls(dht, p2p, store, service, run, role)

    @property
    def peer_id(self) -> PeerID:
        return self.dht.peer_id

    async def shutdown(self) -> None:
        try:
            await asyncio.wait_for(self.service.shutdown(), 10.0)
        except (TimeoutError, Exception) as exc:  # the daemon may already be gone on Ctrl+C
            log.debug("transfer service shutdown: %s", exc)
        await asyncio.get_running_loop().run_in_executor(None, self.dht.shutdown)

    # -- DHT -------------------------------------------------------------------------------------

    async def call(self, fn: Callable[[], T]) -> T:
        """Run a blocking DHT call in a thread (it is bounded by the DHT's own timeout)."""
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    async def get(self, kind: type[M], round_: int) -> list[Verified[M]]:
        try:
            return await self.call(lambda: self.dht.get(kind, round_))
        except NetworkError as exc:
            log.debug("DHT get %s/%d failed: %s", kind.KIND, round_, exc)
            return []

    async def from_validator(self, kind: type[M], round_: int) -> M | None:
        for verified in await self.get(kind, round_):
            if verified.sender_hex in self.validators:
                return verified.message
        return None

    async def round_result(self, round_: int) -> RoundResult | None:
        return await self.from_validator(RoundResult, round_)

    async def validator_heartbeat(self, round_: int) -> Heartbeat | None:
        beat = await self.from_validator(Heartbeat, round_)
        if beat is not None and beat.role == "validator":
            self.validator_peer = PeerID.from_base58(beat.peer_id)
            return beat
        return None

    async def publish(self, message: WireModel) -> None:
        ttl = self.run.record_ttl_seconds
        await self._retry(message.KIND, message.round, lambda: self.dht.publish(message, ttl=ttl))

    async def publish_signed(self, envelope: bytes) -> None:
        signed = SignedMessage.from_bytes(envelope)

        def store() -> None:
            expiration = time.time() + self.run.record_ttl_seconds
            if not self.dht.store_signed(signed, expiration_time=expiration):
                raise NetworkError(f"no peer stored {signed.kind} for round {signed.round}")

        await self._retry(signed.kind, signed.round, store)

    async def _retry(self, kind: str, round_: int, store: Callable[[], object]) -> None:
        """A store that no peer took is tried again after 1 s and 2 s: right after start-up (a
        restarted validator) the DHT node may not know its neighbours yet."""
        for pause in (*PUBLISH_RETRY_SECONDS, None):
            try:
                await self.call(store)
                return
            except NetworkError as exc:
                if pause is None:
                    raise
                log.info("storing the %s of round %d failed (%s); retrying in %.0fs", kind, round_, exc, pause)
                await asyncio.sleep(pause)

    async def announce(self, signed: SignedMessage) -> None:
        """Store an already signed message (e.g. a submission header); a failure is only logged."""
        try:
            await self.publish_signed(signed.to_bytes())
        except NetworkError as exc:
            log.info("could not store the %s for round %d in the DHT: %s", signed.kind, signed.round, exc)

    async def heartbeat(self, round_: int, state_hash: str | None) -> None:
        beat = Heartbeat(
            run_id=self.run_id,
            round=round_,
            role=self.role,
            peer_id=self.peer_id.to_base58(),
            state_hash=state_hash,
            blobs=tuple(self.held[-MAX_HELD_BLOBS:]),
            sent_at=int(time.time()),
        )
        try:
            await self.publish(beat)
        except NetworkError as exc:
            log.warning("could not publish a heartbeat for round %d: %s", round_, exc)

    async def latest_result_round(self, start: int = 0) -> int:
        """The last round with a round result, searched from `start` (exponential, then binary); -1 if none."""
        if await self.round_result(start) is None:
            return start - 1
        lo, step = start, 1
        while await self.round_result(lo + step) is not None:
            lo, step = lo + step, step * 2
        hi = lo + step  # invariant: lo has a result, hi has none
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if await self.round_result(mid) is not None else (lo, mid)
        return lo

    async def latest_checkpoint(self, round_: int) -> CheckpointAnnouncement | None:
        """The newest validator checkpoint at or below `round_`, looking back one checkpoint period."""
        for r in range(round_, max(-1, round_ - self.run.checkpoint_every - 2), -1):
            found = await self.from_validator(CheckpointAnnouncement, r)
            if found is not None:
                return found
        return None

    # -- blobs -----------------------------------------------------------------------------------

    def hold(self, sha256: str) -> None:
        """Announce `sha256` in the next heartbeats (this node re-serves it)."""
        if sha256 in self.held:
            self.held.remove(sha256)
        self.held.append(sha256)
        del self.held[: -MAX_HELD_BLOBS // 2]

    async def fetch(self, sha256: str, size: int, round_: int) -> Path:
        """Blob `sha256` (exactly `size` bytes, hash-checked) from the validator or any holder."""
        if self.store.has(sha256):
            return self.store.path(sha256)
        holders: list[PeerID] = []
        for r in (round_, round_ + 1):
            for verified in await self.get(Heartbeat, r):
                beat = verified.message
                if sha256 in beat.blobs or verified.sender_hex in self.validators:
                    holders.append(PeerID.from_base58(beat.peer_id))
        if self.validator_peer is not None:
            holders.append(self.validator_peer)
        holders = [h for h in dict.fromkeys(holders) if h != self.peer_id]
        try:
            path = await fetch_from_any(self.p2p, holders, sha256, self.store, max_size=size)
        except ProtocolError as exc:
            raise TransferError(f"blob {sha256[:12]}... failed its checks: {exc}") from exc
        if path.stat().st_size != size:
            self.store.remove(sha256)
            raise TransferError(f"blob {sha256[:12]}... is not the {size} bytes announced")
        return path
