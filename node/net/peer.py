"""What a role needs of the network: one interface, two implementations.

    result = await peer.round_result(r)        # the validator's signed verdict for round r, or None
    found = await peer.counted_result(r, base) # the result of round r that counts for a node holding `base`
    path = await peer.fetch(sha256, size, r)   # from the validator or any peer whose heartbeat lists it
    path = await peer.fetch_pieces(sha256, size, r, pieces, check)   # a large blob from all holders at once
    await peer.heartbeat(r, state_hash)        # "alive at round r, serving these blobs"; old blobs go
    peer.hold(sha256, r, "checkpoint")         # announce it in heartbeats (and keep it a while)
    await peer.submit(signed, payload_path, deadline=t, to=peer_id)   # push to a validator; BUSY: again until t
                                               # (a submission, or an RL worker's rollout batch)
    failures = await peer.submit_to_each(signed, payload_path, [(peer_id, t), ...])   # each in turn
    await peer.replicate(envelope, to=peer_id, wait=s)   # the active validator: a standby holds the round's blobs
    peer.take_replicas(on_replica)             # a standby validator: take them (`roles/replicas.py`)
    peer.take_rollouts(taker)                  # an RL validator: take workers' batches (`roles/rl/intake.py`)
    path = await peer.fetch_from(holder, sha256, size, r)   # from that one holder only

- `RunView` reads the run's signed records: round results, checkpoints, heartbeats (and finds the
  latest result). `pulse status` needs nothing more.
- `Peer` is a node on the network: a `RunView` that also publishes records, holds and fetches
  blobs, and pushes (or takes) submissions.

Everything here is written once on top of a few transport primitives (`_get`, `_store`,
`_fetch_one`, `_submit_to`, ...): `p2ppeer.P2PPeer` implements them with hivemind's DHT and libp2p
streams, `memory.MemoryPeer` with an in-process network for the fast test tier. Both check every
record's signature with `dht.PulseRecordValidator` and every blob against its SHA-256. Only records
signed by one of the run's validator keys count as round results and checkpoints.

The chain rule (a manifest may list several validators, in priority order): the result of round r
that counts is, among the run's validators' results for r that start from the state the counted
result of round r-1 produced, the one whose signer comes first in the list. Every node applies the
same rule to the same records, so the run does not fork: two results for one round happen only
when a standby took over from a validator that then published late, and the rule picks one.

A fetch asks the holders that delivered before first and hedges over the others
(`fetching.py`), within one deadline per blob; blobs age out by `retention.py`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from node.net.blobstore import BlobStore
from node.net.budget import Standing
from node.net.dht import sign_for
from node.net.fetching import HolderBook, Progress, fetch_first
from node.net.pieces import Check, FetchProgress, Piece, PieceFetch
from node.net.ranges import probe_down, probe_up, sign_probe
from node.net.records import RecordRules
from node.net.retention import BlobKind, Keeper, Retention
from node.net.streams import DEFAULT_LIMITS, Stream, TransferLimits
from node.net.transfer import (
    OnReplica,
    RolloutTaker,
    TransferCounts,
    TransferService,
    fetch_deadline,
)
from protocol.errors import NetworkError, PeerBusy, ProtocolError, TransferError
from protocol.identity import Identity
from protocol.messages import (
    HEAD_ROUND,
    MAX_HELD_BLOBS,
    MESSAGE_TYPES,
    CheckpointAnnouncement,
    Heartbeat,
    RolloutPool,
    RoundResult,
    RunHead,
    WireModel,
)
from protocol.signing import SignedMessage, Verified

log = logging.getLogger(__name__)

M = TypeVar("M", bound=WireModel)
Role = Literal["bootstrap", "miner", "validator", "follower"]
PUBLISH_RETRY_SECONDS = (1.0, 2.0)
SUBMIT_BACKOFF_SECONDS = (0.5, 8.0)  # first pause after a BUSY answer, longest pause


@dataclass(frozen=True)
class RunRecords:
    """What the network layer needs to know of a run (the roles make it from the manifest)."""

    run_id: str
    validators: tuple[str, ...]  # public keys (hex) whose round results and checkpoints count, in priority order
    record_ttl_seconds: float  # how long this node's DHT records live
    checkpoint_every: int  # how far back the newest checkpoint can be
    payload_rounds: int = 0  # rounds the aggregated payloads and evidence stay fetchable (for auditors)
    keep_checkpoints: int = Retention().keep_checkpoints  # whole checkpoints (BF16, index, FP32 master) kept

    def rules(self) -> RecordRules:
        """The store-time rules every DHT peer of this run applies (`records.py`)."""
        return RecordRules(self.run_id, self.validators)

    def retention(self) -> Retention:
        """What a node keeps: enough rounds for a joiner to replay the patches since a checkpoint."""
        keep = max(Retention().keep_rounds, self.checkpoint_every + 2, self.payload_rounds + 1)
        return Retention(keep_rounds=keep, keep_checkpoints=self.keep_checkpoints)


class RunView(ABC):
    """The run's signed records, as this node reads them."""

    def __init__(self, run: RunRecords) -> None:
        self.run = run

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @abstractmethod
    async def _get(self, kind: type[M], round_: int) -> list[Verified[M]]:
        """The valid `kind` records of `round_`, signature-checked, the validators' first
        (`RecordRules.read_order`); `NetworkError` if unreachable."""

    async def get(self, kind: type[M], round_: int) -> list[Verified[M]]:
        """Every valid `kind` record of `round_` (none when the network does not answer)."""
        try:
            return await self._get(kind, round_)
        except NetworkError as exc:
            log.debug("get %s/%d failed: %s", kind.KIND, round_, exc)
            return []

    async def from_validator(self, kind: type[M], round_: int) -> M | None:
        """The record of the first validator in priority order that has one (reads list them first)."""
        found = [v for v in await self.get(kind, round_) if v.sender_hex in self.run.validators]
        found.sort(key=lambda v: self.run.validators.index(v.sender_hex))
        return found[0].message if found else None

    async def from_validators(self, kind: type[M], round_: int) -> list[Verified[M]]:
        """Every validator's `kind` record of `round_`, in the validators' priority order."""
        found = [v for v in await self.get(kind, round_) if v.sender_hex in self.run.validators]
        return sorted(found, key=lambda v: self.run.validators.index(v.sender_hex))

    async def round_result(self, round_: int) -> RoundResult | None:
        return await self.from_validator(RoundResult, round_)

    async def counted_result(self, round_: int, base: str) -> Verified[RoundResult] | None:
        """The result of `round_` that counts for a node holding the state `base` (the chain rule above)."""
        for verified in await self.from_validators(RoundResult, round_):
            if verified.message.base_state_hash == base:
                return verified
        return None

    async def head(self) -> RunHead | None:
        """The newest head (by its signed `sent_at`) that one of the run's validators published: one
        read at one fixed key, whatever the round."""
        heads = [v.message for v in await self.get(RunHead, HEAD_ROUND) if v.sender_hex in self.run.validators]
        return max(heads, key=lambda h: (h.sent_at, h.open_round), default=None)

    async def position(self) -> tuple[int, CheckpointAnnouncement | None, RunHead | None]:
        """(the open round, the newest checkpoint at or before it, the head they came from).

        From the head when there is one: constant cost at any round, and independent of whether the
        early rounds' records still live. Without one (a validator that has published none yet, or a
        DHT that lost it: the validator re-publishes it within `head_refresh_seconds`), by searching
        the round results from round 0.
        """
        head = await self.head()
        if head is not None:
            return head.open_round, head.checkpoint, head
        current = await self.latest_result_round() + 1
        return current, await self.latest_checkpoint(current), None

    async def latest_result(self, start: int = 0) -> tuple[int, RoundResult | None]:
        """(the last round with a round result, searched from `start`, that result); (start - 1, None) if none.

        Exponential then binary search: O(log rounds) reads, each one round's records.
        """
        found = await self.round_result(start)
        if found is None:
            return start - 1, None
        lo, step = start, 1
        while (ahead := await self.round_result(lo + step)) is not None:
            lo, step, found = lo + step, step * 2, ahead
        hi = lo + step  # invariant: lo has a result (`found`), hi has none
        while hi - lo > 1:
            mid = (lo + hi) // 2
            middle = await self.round_result(mid)
            lo, hi, found = (mid, hi, middle) if middle is not None else (lo, mid, found)
        return lo, found

    async def latest_result_round(self, start: int = 0) -> int:
        """The last round with a round result, searched from `start`; start - 1 if none."""
        return (await self.latest_result(start))[0]

    async def latest_checkpoint(self, round_: int) -> CheckpointAnnouncement | None:
        """The newest validator checkpoint at or below `round_`, looking back one checkpoint period."""
        for r in range(round_, max(-1, round_ - self.run.checkpoint_every - 2), -1):
            found = await self.from_validator(CheckpointAnnouncement, r)
            if found is not None:
                return found
        return None


class Peer(RunView):
    """One node on the network: the run's records, blobs held and fetched, submissions pushed or taken."""

    service: TransferService  # this node's stream handlers (set by each implementation)

    def __init__(
        self, run: RunRecords, identity: Identity, store: BlobStore, role: Role, limits: TransferLimits = DEFAULT_LIMITS
    ) -> None:
        super().__init__(run)
        self.identity, self.store, self.role, self.limits = identity, store, role, limits
        self.held: list[str] = []  # blobs announced in heartbeats, newest last
        self.validator_peer: str | None = None  # the active validator's peer id, from its heartbeat or head
        self.alone = False  # started with no peer to dial first: it can find nobody (libp2p peers only)
        self.holders = HolderBook(on_delivered=self._delivered)  # who delivered blobs, who failed
        self.keeper = Keeper(store, run.retention())
        self.standing_keys = Standing()  # keys aggregated, or whose rollouts a pool took, lately (`_note_standing`)

    # -- what an implementation provides -----------------------------------------------------------

    @property
    @abstractmethod
    def peer_id(self) -> str:
        """This node's transport address (a libp2p peer id in base58), as heartbeats name it."""

    @abstractmethod
    async def _store(self, signed: SignedMessage) -> bool:
        """Store a signed record under its signer's subkey until its signed expiry; False if no peer took it."""

    @abstractmethod
    async def _fetch_one(self, holder: str, sha256: str, size: int, on_body: Callable[[Progress], None]) -> Path:
        """Blob `sha256` (at most `size` bytes, hash-checked) from `holder` into `store`; `on_body`
        when its body starts. `TransferError`/`ProtocolError` on any failure, nothing stored."""

    @abstractmethod
    def _open_fetch(self, holder: str) -> AbstractAsyncContextManager[Stream]:
        """A fetch stream to `holder` (a peer id), for parts of blobs and link probes (`ranges.py`)."""

    @abstractmethod
    async def _submit_to(self, validator: str, signed: SignedMessage, payload: Path) -> None:
        """One push of a submission to `validator`: `PeerBusy` if it has no slot, `TransferError` if refused."""

    @abstractmethod
    async def _replicate_to(self, validator: str, envelope: bytes, wait: float) -> None:
        """Hand a signed round result to the validator at peer id `validator`; returns once it holds the
        result's blobs. `TransferError` if refused, `TimeoutError` past `wait` seconds."""

    def take_replicas(self, on_replica: OnReplica | None) -> None:
        """Take replicas pushed by the run's active validator (a standby; None: refuse them again)."""
        self.service.on_replica = on_replica

    def take_rollouts(self, taker: RolloutTaker | None) -> None:
        """Take rollout batches pushed by workers (an RL validator's pool; None: refuse them again)."""
        self.service.rollouts = taker

    @abstractmethod
    async def shutdown(self) -> None: ...

    # -- for metrics (`roles/metrics.py`); None where an implementation cannot tell ------------------

    def known_peers(self) -> int | None:
        """Peers this node knows on the network (may block on the DHT: call it from a thread)."""
        return None

    def transfer_counts(self) -> TransferCounts | None:
        """What this node's blob service did for others."""
        return None

    # -- records ---------------------------------------------------------------------------------

    async def get(self, kind: type[M], round_: int) -> list[Verified[M]]:
        found = await super().get(kind, round_)
        self._note_standing(found)
        return found

    def has_standing(self, key: bytes) -> bool:
        """Whether `key` (a public key) has standing here: reads look at its records first (`read_order`)."""
        return key.hex() in self.standing_keys

    def grant_standing(self, keys: Sequence[str]) -> None:
        """Keys with standing (e.g. the validator's established miners): the peers their heartbeats
        name may take the reserved send slots of this node (`transfer.py`)."""
        for key in keys:
            self.standing_keys.grant(key)

    def _delivered(self, holder: str) -> None:
        self.service.standing.grant(holder)  # it served a hash-checked blob: it holds the run's state

    def _note_standing(self, found: Sequence[Verified[M]]) -> None:
        """Standing from the records this node reads: the validators' peers, the keys a validator
        aggregated, the peers the heartbeats of those keys name. Fresh keys earn none of it."""
        for verified in found:
            message, sender = verified.message, verified.sender_hex
            if isinstance(message, RoundResult) and sender in self.run.validators:
                self.grant_standing([s.sender for s in message.selected])
            elif isinstance(message, RolloutPool) and sender in self.run.validators:
                self.grant_standing([e.worker for e in message.entries])  # workers whose rollouts it took
            elif isinstance(message, Heartbeat) and (sender in self.run.validators or sender in self.standing_keys):
                self.service.standing.grant(message.peer_id)

    async def validator_heartbeat(self, round_: int) -> Heartbeat | None:
        beat = await self.from_validator(Heartbeat, round_)
        if beat is not None and beat.role == "validator":
            self.validator_peer = beat.peer_id
            return beat
        return None

    async def validator_heartbeats(self, round_: int) -> list[Verified[Heartbeat]]:
        """Every validator's heartbeat for `round_` (the active one's and the standbys'), in priority order."""
        beats = [v for v in await self.from_validators(Heartbeat, round_) if v.message.role == "validator"]
        if beats:
            self.validator_peer = beats[0].message.peer_id
        return beats

    def sign(self, message: WireModel) -> SignedMessage:
        """`message` signed by this node, fresh: kept in the DHT for the run's record TTL from now."""
        return sign_for(self.identity, message, self.run.record_ttl_seconds)

    async def publish(self, message: WireModel) -> None:
        """Sign and store `message`; `NetworkError` if no peer took it after two retries."""
        await self.publish_signed(self.sign(message).to_bytes())

    async def publish_signed(self, envelope: bytes) -> None:
        """Store a signed message: others' as they signed it (a relay), this node's own signed
        afresh if it would not live half a TTL more (e.g. a result signed without an expiry, or
        republished after a restart), so the stored record is the newest of its owner."""
        signed = self._fresh(SignedMessage.from_bytes(envelope))

        async def store() -> None:
            if not await self._store(signed):
                raise NetworkError(f"no peer stored {signed.kind} for round {signed.round}")

        await self._retry(signed.kind, signed.round, store)

    def _fresh(self, signed: SignedMessage) -> SignedMessage:
        ttl = self.run.record_ttl_seconds
        kind = MESSAGE_TYPES.get(signed.kind)
        if signed.sender != self.identity.public_key or kind is None or signed.expires_at > time.time() + ttl / 2:
            return signed
        return sign_for(self.identity, signed.open(run_id=self.run_id, expect=kind), ttl)

    async def _retry(self, kind: str, round_: int, store: Callable[[], Awaitable[None]]) -> None:
        """A store that no peer took is tried again after 1 s and 2 s: right after start-up (a
        restarted validator) the DHT node may not know its neighbours yet."""
        for pause in (*PUBLISH_RETRY_SECONDS, None):
            try:
                await store()
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

    async def heartbeat(
        self, round_: int, state_hash: str | None, *, target_seconds: float | None = None, sent_at: int | None = None
    ) -> None:
        """Publish 'alive at round r, serving these blobs', after dropping the blobs retention no longer keeps."""
        removed = set(self.keeper.sweep(round_))
        # announce only what is on disk (a role may also remove blobs itself, e.g. old payloads)
        self.held = [sha for sha in self.held if sha not in removed and self.store.has(sha)]
        beat = Heartbeat(
            run_id=self.run_id,
            round=round_,
            role=self.role,
            peer_id=self.peer_id,
            state_hash=state_hash,
            blobs=tuple(self.held[-MAX_HELD_BLOBS:]),
            sent_at=int(time.time()) if sent_at is None else sent_at,
            target_seconds=target_seconds,
        )
        try:
            await self.publish(beat)
        except NetworkError as exc:
            log.warning("could not publish a heartbeat for round %d: %s", round_, exc)

    # -- blobs -----------------------------------------------------------------------------------

    def hold(self, sha256: str, round_: int, kind: BlobKind = "patch") -> None:
        """Announce `sha256` (a blob of round `round_`) in the next heartbeats: this node re-serves
        it, and keeps it as `retention` says for its kind."""
        self.keeper.tag(sha256, round_, kind)
        if sha256 in self.held:
            self.held.remove(sha256)
        self.held.append(sha256)
        del self.held[: -MAX_HELD_BLOBS // 2]

    async def fetch(self, sha256: str, size: int, round_: int) -> Path:
        """Blob `sha256` (exactly `size` bytes, hash-checked) from the validator or any holder of
        round `round_` (or the next), the fastest that delivers, within one deadline."""
        if self.store.has(sha256):
            return self.store.path(sha256)
        holders, trusted = await self._holders(sha256, round_)
        path = await fetch_first(
            [h for h in holders if h != self.peer_id],
            lambda holder, on_body: self._fetch_one(holder, sha256, size, on_body),
            book=self.holders,
            sha256=sha256,
            deadline=time.monotonic() + fetch_deadline(size, self.limits),
            hedge_after=self.limits.hedge_after,
            hedge_rate=self.limits.hedge_rate,
            trusted=trusted,
        )
        if path.stat().st_size != size:
            self.store.remove(sha256)
            raise TransferError(f"blob {sha256[:12]}... is not the {size} bytes announced")
        self.keeper.tag_new(sha256, round_, "patch")
        return path

    async def fetch_from(self, holder: str, sha256: str, size: int, round_: int) -> Path:
        """Blob `sha256` (exactly `size` bytes, hash-checked) from `holder` alone, within one deadline;
        `TransferError` (or `ProtocolError`) if it cannot deliver, nothing stored then."""
        if self.store.has(sha256):
            return self.store.path(sha256)
        try:
            async with asyncio.timeout(fetch_deadline(size, self.limits)):
                path = await self._fetch_one(holder, sha256, size, lambda _: None)
        except TimeoutError as exc:
            raise TransferError(f"{holder} did not deliver blob {sha256[:12]}... in time") from exc
        if path.stat().st_size != size:
            self.store.remove(sha256)
            raise TransferError(f"blob {sha256[:12]}... is not the {size} bytes announced")
        self.keeper.tag_new(sha256, round_, "patch")
        return path

    async def holders_of(self, sha256: str, round_: int) -> list[str]:
        """Peers whose heartbeat of `round_` or the next lists `sha256`, and the validators' peers (not this one)."""
        holders, _ = await self._holders(sha256, round_)
        return [h for h in dict.fromkeys(holders) if h != self.peer_id]

    async def _holders(self, sha256: str, round_: int) -> tuple[list[str], set[str]]:
        """Peers whose heartbeat of `round_` or the next lists `sha256`, and the validators' peers."""
        holders: list[str] = []
        trusted: set[str] = set()
        for r in (round_, round_ + 1):
            for verified in await self.get(Heartbeat, r):
                beat = verified.message
                if verified.sender_hex in self.run.validators:
                    trusted.add(beat.peer_id)
                if sha256 in beat.blobs or verified.sender_hex in self.run.validators:
                    holders.append(beat.peer_id)
        if self.validator_peer is not None:
            holders.append(self.validator_peer)
            trusted.add(self.validator_peer)
        return holders, trusted

    # -- submissions -----------------------------------------------------------------------------

    async def submit(
        self, signed: SignedMessage, payload: Path, *, deadline: float | None = None, to: str | None = None
    ) -> None:
        """Push a signed submission header (or an RL worker's rollout announcement) and the file it
        names to the validator at peer id `to` (default: the one of the last validator heartbeat
        read). A validator with no free slot (BUSY) is asked again with growing pauses until
        `deadline` (unix time); `TransferError` if it refused, `PeerBusy` if it was still busy then."""
        pause, longest = SUBMIT_BACKOFF_SECONDS
        validator = to or self.validator_peer
        while True:
            if validator is None:
                raise TransferError("the validator's peer id is unknown")
            try:
                await self._submit_to(validator, signed, payload)
                return
            except PeerBusy as exc:
                wait = pause * random.uniform(0.5, 1.5)  # spread the retries of many miners
                if deadline is None or time.time() + wait >= deadline:
                    raise
                log.info("the validator is busy (%s); trying again in %.1fs", exc, wait)
                await asyncio.sleep(wait)
                pause = min(2 * pause, longest)

    async def submit_to_each(
        self, signed: SignedMessage, payload: Path, validators: Sequence[tuple[str, float]]
    ) -> list[tuple[str, str]]:
        """`submit` to each of `validators` (peer id, deadline for a busy one) in turn; (peer id, why)
        of each that did not take it (as many as `validators` when none took it)."""
        failures = []
        for validator, deadline in validators:
            try:
                await self.submit(signed, payload, deadline=deadline, to=validator)
            except (TransferError, ProtocolError) as exc:
                failures.append((validator, str(exc)))
        return failures

    async def replicate(self, envelope: bytes, *, to: str, wait: float) -> None:
        """Hand signed round result `envelope` to the standby validator at peer id `to` and wait (at
        most `wait` seconds) until it holds the blobs the result names: `TransferError` if it refused
        or did not answer in time."""
        try:
            async with asyncio.timeout(wait):
                await self._replicate_to(to, envelope, wait)
        except TimeoutError as exc:
            raise TransferError(f"{to} did not take the replica within {wait:g}s") from exc

    # -- pieces and probes ------------------------------------------------------------------------

    async def fetch_pieces(
        self,
        sha256: str,
        size: int,
        round_: int,
        pieces: Sequence[Piece],
        check: Check,
        *,
        on_progress: Callable[[FetchProgress], None] | None = None,
    ) -> Path:
        """Blob `sha256` from every holder at once, piece by piece, each piece checked on arrival
        (`pieces.py`): a lying holder is dropped, a dead one replaced, a partial download resumed."""
        fetch = PieceFetch(
            self.store,
            sha256,
            size,
            pieces,
            check,
            self._open_fetch,
            lambda: self.holders_of(sha256, round_),
            on_progress=on_progress,
            exclude=self.peer_id,
        )
        limits = self.limits
        return await fetch.run(time.monotonic() + 2 * limits.open_timeout + size / limits.min_bytes_per_second)

    async def probe(self, holder: str, down_bytes: int, up_bytes: int) -> tuple[float, float]:
        """(download, upload) rates in bytes/s between this node and `holder`, measured with probes."""
        down_request = sign_probe(self.identity, self.run_id, b"P", down_bytes)
        async with self._open_fetch(holder) as stream:
            down = await probe_down(stream, holder, down_bytes, self.limits, signed=down_request)
        up_request = sign_probe(self.identity, self.run_id, b"S", up_bytes)
        async with self._open_fetch(holder) as stream:
            up = await probe_up(stream, holder, up_bytes, self.limits, signed=up_request)
        return down_bytes / max(down, 1e-6), up_bytes / max(up, 1e-6)
