"""Signed records on hivemind's DHT: a thin wrapper plus the validator every peer runs.

Record layout (one record per message kind, round and owner):

    key     dht_key(run, kind, round) = "pulse/v2/<run id>/<kind>/<round>"  (hivemind hashes it)
    subkey  the owner's 32-byte Ed25519 public key
    value   the signed envelope bytes (`protocol/signing.py`), under its kind's cap (< 64 KiB)
    expiry  exactly the one the owner signed (`SignedMessage.expires_ms`)

Because hivemind hashes the key, the owner marker lives in the subkey (as in hivemind's
`RSASignatureValidator`). `PulseRecordValidator` runs on every peer, on every record it is asked
to store and on every record a peer returns to it, and rejects: records without an owner
subkey, bad signatures, envelopes signed by someone other than the subkey owner, other runs,
records stored under a key other than the one their (kind, round) names, kinds without a policy,
validator-only kinds from anyone else, values over their kind's cap, and expirations other than
the signed one or beyond `max_ttl` (`records.py`). Inside the DHT process `dhtprocess.py` bounds
what a peer keeps. Nothing is signed in `sign_value`: the application signs the envelope itself,
so the same bytes can also travel outside the DHT.

A read (`PulseDHT.get`) looks at the run's validators' records first, then at most as many
others as a peer keeps. If hivemind's DHT process dies, `restart()` starts another on the same
options (the libp2p identity file, if any, keeps the peer id), after releasing the locks a killed
DHT process may have left held (`_free_shared_locks`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import hivemind
import msgpack
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import P2P, PeerID
from hivemind.utils.mpfuture import MPFuture, SharedBytes
from hivemind.utils.timed_storage import get_dht_time

from node.net import dhtprocess
from node.net.lifetime import listen_conflicts
from node.net.netconfig import NetConfig, prepare_identity
from node.net.records import MAX_DHT_VALUE_BYTES, RecordRules, capped_ttl, no_standing
from node.net.streams import printable
from protocol.errors import (
    InvalidRecord,
    InvalidSignature,
    MalformedPayload,
    NetworkError,
    ProtocolError,
    SizeLimitExceeded,
    WrongRun,
)
from protocol.identity import PUBLIC_KEY_BYTES, Identity
from protocol.messages import PROTOCOL_VERSION, Heartbeat, RunHead, WireModel
from protocol.signing import MAX_ENVELOPE_BYTES, SeenCache, SignedMessage, Verified, open_parsed, sign

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=WireModel)

CACHE_KEYS = 4096  # keys a peer caches from its own reads and its neighbours' (hivemind: unbounded)
_OWNER_SUBKEY_PREFIX = b"\xc4\x20"  # msgpack header of a 32-byte binary: hivemind packs subkeys


def dht_key(run_id: str, kind: str, round_: int) -> str:
    return f"pulse/v{PROTOCOL_VERSION}/{run_id}/{kind}/{round_}"


def dht_key_id(run_id: str, kind: str, round_: int) -> bytes:
    """What `record.key` holds for `dht_key(...)`: hivemind's hash of the key."""
    return DHTID.generate(source=dht_key(run_id, kind, round_)).to_bytes()


class PulseRecordValidator(RecordValidatorBase):
    """Accepts only signed pulse records of one run, stored by their signer at their own key,
    within the run's `RecordRules` (who may write the kind, its size, the signed expiration)."""

    def __init__(self, rules: RecordRules) -> None:
        self.rules = rules

    @property
    def run_id(self) -> str:
        return self.rules.run_id

    def validate(self, record: DHTRecord) -> bool:
        try:
            self.check(record)
        except ProtocolError as exc:
            logger.debug("rejected DHT record: %s", exc)
            return False
        return True

    def check(self, record: DHTRecord) -> Verified[WireModel]:
        """The verified message in `record`, or a `ProtocolError` saying why it is rejected.

        The cheap checks (size, kind, writer, expiration, key) come before the signature, so a
        flood of junk costs a peer little."""
        owner = owner_from_subkey(record.subkey)
        if len(record.value) > MAX_DHT_VALUE_BYTES:
            raise InvalidRecord(f"value is {len(record.value)} bytes, cap is {MAX_DHT_VALUE_BYTES}")
        signed = SignedMessage.from_bytes(_unpack_bin(record.value))
        if signed.run_id != self.run_id:
            raise WrongRun(f"record of run {signed.run_id[:12]}..., this peer is on run {self.run_id[:12]}...")
        self.rules.check_size(signed.kind, len(record.value))
        if signed.sender != owner:
            raise InvalidSignature("record is stored under another key's subkey than its signer's")
        self.rules.check_writer(signed)
        self.rules.check_expiration(signed, record.expiration_time, get_dht_time())
        if record.key != dht_key_id(self.run_id, signed.kind, signed.round):
            raise InvalidRecord(f"{signed.kind} for round {signed.round} is stored under another key")
        return open_parsed(signed, run_id=self.run_id)

    @property
    def priority(self) -> int:
        return 10  # like RSASignatureValidator: check signatures before anything parses the value


def owner_from_subkey(subkey: bytes) -> bytes:
    if len(subkey) != len(_OWNER_SUBKEY_PREFIX) + PUBLIC_KEY_BYTES or not subkey.startswith(_OWNER_SUBKEY_PREFIX):
        raise InvalidSignature("unsigned record: its subkey is not an owner's public key")
    return subkey[len(_OWNER_SUBKEY_PREFIX) :]


def _unpack_bin(value: bytes) -> bytes:
    """The envelope inside a record value, which hivemind msgpack-encodes as one `bin` object."""
    try:
        inner = msgpack.unpackb(value, raw=True, max_bin_len=MAX_ENVELOPE_BYTES, max_str_len=0)
    except (ValueError, msgpack.UnpackException) as exc:
        raise MalformedPayload(f"record value is not one msgpack binary: {exc}") from exc
    if not isinstance(inner, bytes):
        raise MalformedPayload("record value is not a signed envelope")
    return inner


@dataclass(frozen=True)
class Stored:
    """What a store did: how many peers other than the writer kept the record."""

    others: int  # peers other than this one that stored it
    here: bool  # whether this node's own storage kept it
    asked: int  # peers other than this one it was offered to (the nearest this node found)

    @property
    def published(self) -> bool:
        """Kept by another peer; or, with no other peer to ask (a node alone), by this one."""
        return self.others > 0 or (self.asked == 0 and self.here)


class PulseDHT:
    """Our records on a `hivemind.DHT` that runs in a background process.

    The methods block (hivemind's DHT API is synchronous, backed by a pipe to its process) and
    every one is bounded by `timeout`. Start one with `PulseDHT.start(...)`; always `shutdown()`.
    """

    def __init__(
        self, dht: hivemind.DHT, rules: RecordRules, identity: Identity, config: NetConfig, *, timeout: float = 30.0
    ) -> None:
        self.dht, self.rules, self.identity, self.config, self.timeout = dht, rules, identity, config, timeout
        self.restarts = 0
        self._validator = PulseRecordValidator(rules)  # the same checks as the DHT process runs
        self._told_head = -1  # the highest round of a validator record this node told its storage of
        self._salt = os.urandom(16)  # this reader's order of the signers it does not prefer (`read_order`)

    @property
    def run_id(self) -> str:
        return self.rules.run_id

    @classmethod
    def start(cls, config: NetConfig, rules: RecordRules, identity: Identity) -> PulseDHT:
        """Start the DHT process and its libp2p daemon, and join the swarm via `initial_peers`."""
        busy = listen_conflicts(config.host_maddrs)  # else p2pd would share the port with its holder
        if busy:
            raise NetworkError("; ".join(busy))
        return cls(_launch(config, rules), rules, identity, config)

    @property
    def alive(self) -> bool:
        return bool(self.dht.is_alive())

    def restart(self) -> None:
        """A new DHT process (and libp2p daemon) on the same options, after the old one died."""
        logger.warning("the DHT process stopped (exit code %s); starting a new one", self.dht.exitcode)
        self._stop(self.dht)
        self.dht = _launch(self.config, self.rules)
        self.restarts += 1
        self._told_head = -1  # a new process: its storage knows nothing yet

    @property
    def peer_id(self) -> PeerID:
        return self.dht.peer_id

    def visible_maddrs(self) -> list[str]:
        return [str(addr) for addr in self.dht.get_visible_maddrs()]

    async def replicate_p2p(self) -> P2P:
        """A P2P handle in this process on the DHT's own daemon (for blob streams)."""
        return await self.dht.replicate_p2p()

    def publish(self, message: WireModel, *, ttl: float) -> SignedMessage:
        """Sign `message` to live `ttl` seconds and store it; `NetworkError` if no peer (nor we) stored it."""
        signed = sign_for(self.identity, message, ttl)
        if not self.store_signed(signed).published:
            raise NetworkError(f"no peer other than this one stored {message.KIND} for round {message.round}")
        return signed

    def store_signed(self, signed: SignedMessage) -> Stored:
        """Store an already signed message under its signer's subkey, until its signed expiry
        (also used to relay one): on this node and on the peers nearest its key, each asked and
        counted (hivemind's own store reports only the replica that answered last, so a record that
        only the writer kept looked published)."""
        value = signed.to_bytes()
        if len(value) > MAX_ENVELOPE_BYTES:
            raise SizeLimitExceeded(f"signed {signed.kind} is {len(value)} bytes, cap is {MAX_ENVELOPE_BYTES}")
        store = functools.partial(
            _store_counted,
            key=dht_key(signed.run_id, signed.kind, signed.round),
            subkey=signed.sender,
            value=value,
            expiration=signed.expires_at,
        )
        others, here, asked = self._result(self._call().run_coroutine(store, return_future=True), "store")
        return Stored(others=others, here=here, asked=asked)

    def get(self, kind: type[M], round_: int, preferred: Callable[[bytes], bool] = no_standing) -> list[Verified[M]]:
        """The valid `kind` records of `round_`, re-verified here: the run's validators' first (in
        priority order), then those of the signers `preferred` (standing), then others in this
        reader's own order, no more than a peer keeps of one key (`RecordRules.read_order`)."""
        future = self._call().get(dht_key(self.run_id, kind.KIND, round_), latest=True, return_future=True)
        found = self._result(future, "get")
        if found is None or not isinstance(found.value, dict):
            return []
        entries = {subkey: entry for subkey, entry in found.value.items() if isinstance(subkey, bytes)}
        out: list[Verified[M]] = []
        for subkey in self.rules.read_order(list(entries), kind.KIND, salt=self._salt, preferred=preferred):
            entry = entries[subkey]
            try:
                out.append(self._reverify(kind, round_, subkey, entry.value, entry.expiration_time))
            except ProtocolError as exc:
                logger.warning("ignored a %s record that failed local checks: %s", kind.KIND, printable(str(exc)))
        rounds = [_run_round(v.message) for v in out if self.rules.is_validator(bytes.fromhex(v.sender_hex))]
        if rounds and max(rounds) > self._told_head:
            self.learn_head(max(rounds))
        return out

    def learn_head(self, round_: int) -> None:
        """Tell this node's storage that the run's validators wrote round `round_` (a record this node
        read and verified): a storage learns the head only from the validator records it is asked to
        store, and until it knows one it takes the run's start for the head (far rounds refused). Not
        waited for: the storage takes it with its next request."""
        self._told_head = max(self._told_head, round_)
        self._call().run_coroutine(functools.partial(dhtprocess.learn_head, round_=round_), return_future=True)

    def get_new(self, kind: type[M], round_: int, seen: SeenCache) -> list[Verified[M]]:
        """Like `get`, without messages whose id is in `seen` (replays); records the new ones."""
        return [v for v in self.get(kind, round_) if seen.add(v.message_id)]

    def find_providers(self, round_: int, sha256: str) -> list[PeerID]:
        """Peers whose heartbeat for `round_` says they serve blob `sha256`."""
        beats = self.get(Heartbeat, round_)
        return [PeerID.from_base58(v.message.peer_id) for v in beats if sha256 in v.message.blobs]

    def known_peers(self) -> int:
        """Peers in this node's DHT routing table; `NetworkError` if the DHT process does not answer in time."""
        return int(self._result(self._call().run_coroutine(_routing_table_size, return_future=True), "peer count"))

    def shutdown(self) -> None:
        self._stop(self.dht)

    def _call(self) -> hivemind.DHT:
        if not self.alive:
            raise NetworkError(f"the DHT process has stopped (exit code {self.dht.exitcode})")
        return self.dht

    def _reverify(self, kind: type[M], round_: int, subkey: object, value: object, exp: float) -> Verified[M]:
        return verify_record(self._validator, kind, round_, subkey, value, exp)

    def _result(self, future: MPFuture, what: str) -> Any:
        try:
            return future.result(timeout=self.timeout)
        except TimeoutError as exc:
            future.cancel()
            dead = "" if self.alive else " (the DHT process has stopped)"
            raise NetworkError(f"DHT {what} did not finish within {self.timeout:.0f}s{dead}") from exc

    @staticmethod
    def _stop(dht: hivemind.DHT) -> None:
        try:
            dht.shutdown()
        except (OSError, ValueError) as exc:  # a dead process's pipe is already closed
            logger.debug("DHT shutdown: %s", exc)


def _run_round(message: WireModel) -> int:
    """The round of the run a validator's record says it reached (a head sits at one fixed round)."""
    return message.open_round if isinstance(message, RunHead) else message.round


def sign_for(identity: Identity, message: WireModel, ttl: float) -> SignedMessage:
    """`message` signed to be kept `ttl` seconds from now (its DHT expiration; an open kind's at most
    `records.OPEN_MAX_TTL`)."""
    return sign(identity, message, expires_ms=int((get_dht_time() + capped_ttl(message.KIND, ttl)) * 1000))


# How long a lock of hivemind's futures may stay held before its holder counts as dead: a live
# holder keeps it for one pipe write of a reply (DHT values are capped: milliseconds at most).
SHARED_LOCK_WAIT = 5.0


def _free_shared_locks(wait: float) -> list[str]:
    """Release the locks of hivemind's futures that a dead process holds; the names of those released.

    Every DHT process writes its replies into one pipe to this process, and hivemind guards that
    pipe (and the futures' shared memory) with `multiprocessing` locks that the DHT processes
    inherit when they are forked. A DHT process killed inside one (SIGKILL or the OOM killer in the
    middle of a reply) leaves it held for good: every DHT process of this node then hangs at its
    next reply, and one forked later at its first, so a restart would time out and the node would
    never get its DHT back. A lock nobody releases within `wait` seconds is released here (these
    locks may be released by any process), which frees the waiting ones as well.
    """
    released = []
    for owner, name in ((MPFuture, "_update_lock"), (MPFuture, "_initialization_lock"), (SharedBytes, "_lock")):
        lock = getattr(owner, name)
        if not lock.acquire(timeout=wait):
            released.append(f"{owner.__name__}.{name}")
        lock.release()
    if released:
        logger.warning("a dead DHT process held %s: released, so DHT processes do not hang", ", ".join(released))
    return released


def _launch(config: NetConfig, rules: RecordRules) -> hivemind.DHT:
    """A running DHT process with pulse's record validator, bounded storage, waiting pipe and locked sends."""
    prepare_identity(config)
    _free_shared_locks(SHARED_LOCK_WAIT)
    validator = PulseRecordValidator(rules)
    dht = dhtprocess.MortalDHT(start=False, record_validators=[validator], cache_size=CACHE_KEYS, **config.dht_kwargs())
    try:
        dht.run_in_background(await_ready=True, timeout=config.startup_timeout + 30)
        dht._outer_pipe = dhtprocess.LockedPipe(dht._outer_pipe)  # this side only: the child never sends on it
        installed = dht.run_coroutine(functools.partial(dhtprocess.install, rules=rules), return_future=True)
        installed.result(timeout=config.startup_timeout)
    except Exception as exc:  # hivemind raises plain Exceptions (P2PDaemonError, failed bootstrap)
        PulseDHT._stop(dht)
        hint = " (are the initial peers running and reachable?)" if config.initial_peers else ""
        raise NetworkError(f"could not start the DHT: {exc}{hint}") from exc
    return dht


async def _routing_table_size(_: hivemind.DHT, node: DHTNode) -> int:
    """Runs inside the DHT process (hivemind's `run_coroutine`): the peers its routing table holds."""
    return len(node.protocol.routing_table.uid_to_peer_id)


def verify_record(
    validator: PulseRecordValidator, kind: type[M], round_: int, subkey: object, value: object, expiration: float
) -> Verified[M]:
    """The `kind` message of a record stored at (kind, round_) with this owner subkey and envelope,
    checked as every DHT peer checks it (`PulseRecordValidator`); a `ProtocolError` says why not."""
    if not isinstance(subkey, bytes) or not isinstance(value, bytes):
        raise MalformedPayload("record subkey or value is not bytes")
    key = dht_key_id(validator.run_id, kind.KIND, round_)
    verified = validator.check(DHTRecord(key, _pack_bin(subkey), _pack_bin(value), expiration))
    if not isinstance(verified.message, kind):
        raise MalformedPayload(f"expected {kind.KIND}, found {verified.signed.kind}")
    return Verified(verified.signed, verified.message)


def check_store(validator: PulseRecordValidator, signed: SignedMessage) -> Verified[WireModel]:
    """What a DHT peer checks when asked to store `signed` the way `PulseDHT.store_signed` stores it."""
    key = dht_key_id(signed.run_id, signed.kind, signed.round)
    return validator.check(DHTRecord(key, _pack_bin(signed.sender), _pack_bin(signed.to_bytes()), signed.expires_at))


def _pack_bin(data: bytes) -> bytes:
    return msgpack.packb(data, use_bin_type=True)


async def _store_counted(
    _: hivemind.DHT, node: DHTNode, *, key: str, subkey: bytes, value: bytes, expiration: float
) -> tuple[int, bool, int]:
    """Runs inside the DHT process: store one record here and on the peers nearest its key; (peers
    other than this one that stored it, whether this one did, peers asked)."""
    key_id = DHTID.generate(source=key)
    found = await node.find_nearest_nodes([key_id], k_nearest=node.num_replicas, exclude_self=True)
    nearest = list(found.get(key_id, {}).values())
    packed = node.protocol.serializer.dumps(value)
    record = DHTRecord(key_id.to_bytes(), node.protocol.serializer.dumps(subkey), packed, expiration)
    checks = node.protocol.record_validator
    here = (checks is None or checks.validate(record)) and node.protocol.storage.store(
        key_id, packed, expiration, subkey=subkey
    )
    calls = [
        node.protocol.call_store(peer, keys=[key_id], values=[packed], expiration_time=[expiration], subkeys=[subkey])
        for peer in nearest
    ]
    answers = await asyncio.gather(*calls, return_exceptions=True)  # each call is bounded by hivemind's wait_timeout
    # an answer is a protobuf list of one bool, None if the peer did not answer, or an exception
    others = sum(1 for a in answers if a is not None and not isinstance(a, BaseException) and len(a) and a[0])
    return others, bool(here), len(nearest)
