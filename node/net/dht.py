"""Signed records on hivemind's DHT: a thin wrapper plus the validator every peer runs.

Record layout (one record per message kind, round and owner):

    key     dht_key(run, kind, round) = "pulse/v1/<run id>/<kind>/<round>"  (hivemind hashes it)
    subkey  the owner's 32-byte Ed25519 public key
    value   the signed envelope bytes (`protocol/signing.py`), under 64 KiB

Because hivemind hashes the key, the owner marker lives in the subkey (as in hivemind's
`RSASignatureValidator`). `PulseRecordValidator` runs on every peer, on every record it is asked
to store and on every record a peer returns to it, and rejects: records without an owner
subkey, bad signatures, envelopes signed by someone other than the subkey owner, other runs,
records stored under a key other than the one their (kind, round) names, values over the cap and
expirations beyond `max_ttl`. Nothing is signed in `sign_value`: the application signs the
envelope itself, so the same bytes can also travel outside the DHT.
"""

from __future__ import annotations

import logging
import math
from typing import Any, TypeVar

import hivemind
import msgpack
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import P2P, PeerID
from hivemind.utils.mpfuture import MPFuture
from hivemind.utils.timed_storage import get_dht_time

from node.net.netconfig import NetConfig
from protocol.errors import (
    InvalidRecord,
    InvalidSignature,
    MalformedPayload,
    NetworkError,
    ProtocolError,
    SizeLimitExceeded,
)
from protocol.identity import PUBLIC_KEY_BYTES, Identity
from protocol.messages import PROTOCOL_VERSION, Heartbeat, WireModel
from protocol.signing import MAX_ENVELOPE_BYTES, SeenCache, SignedMessage, Verified, open_any, sign

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=WireModel)

MAX_DHT_VALUE_BYTES = 64 * 1024 - 1
DEFAULT_MAX_TTL = 24 * 3600.0  # longest a record may live: a day of rounds
CLOCK_SKEW = 120.0  # seconds of clock difference between honest peers that we tolerate
_OWNER_SUBKEY_PREFIX = b"\xc4\x20"  # msgpack header of a 32-byte binary: hivemind packs subkeys


def dht_key(run_id: str, kind: str, round_: int) -> str:
    return f"pulse/v{PROTOCOL_VERSION}/{run_id}/{kind}/{round_}"


def dht_key_id(run_id: str, kind: str, round_: int) -> bytes:
    """What `record.key` holds for `dht_key(...)`: hivemind's hash of the key."""
    return DHTID.generate(source=dht_key(run_id, kind, round_)).to_bytes()


class PulseRecordValidator(RecordValidatorBase):
    """Accepts only signed pulse records of one run, stored by their signer at their own key."""

    def __init__(self, run_id: str, max_ttl: float = DEFAULT_MAX_TTL) -> None:
        self.run_id = run_id
        self.max_ttl = max_ttl

    def validate(self, record: DHTRecord) -> bool:
        try:
            self.check(record)
        except ProtocolError as exc:
            logger.debug("rejected DHT record: %s", exc)
            return False
        return True

    def check(self, record: DHTRecord) -> Verified[WireModel]:
        """The verified message in `record`, or a `ProtocolError` saying why it is rejected."""
        owner = owner_from_subkey(record.subkey)
        if len(record.value) > MAX_DHT_VALUE_BYTES:
            raise InvalidRecord(f"value is {len(record.value)} bytes, cap is {MAX_DHT_VALUE_BYTES}")
        self._check_expiration(record.expiration_time)
        verified = open_any(_unpack_bin(record.value), run_id=self.run_id)
        signed = verified.signed
        if signed.sender != owner:
            raise InvalidSignature("record is stored under another key's subkey than its signer's")
        if record.key != dht_key_id(self.run_id, signed.kind, signed.round):
            raise InvalidRecord(f"{signed.kind} for round {signed.round} is stored under another key")
        return verified

    def _check_expiration(self, expiration: float) -> None:
        limit = get_dht_time() + self.max_ttl + CLOCK_SKEW
        if not math.isfinite(expiration) or expiration > limit:
            raise InvalidRecord(f"expiration {expiration} is more than {self.max_ttl:.0f}s ahead")

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


class PulseDHT:
    """Our records on a `hivemind.DHT` that runs in a background process.

    The methods block (hivemind's DHT API is synchronous, backed by a pipe to its process) and
    every one is bounded by `timeout`. Start one with `PulseDHT.start(...)`; always `shutdown()`.
    """

    def __init__(
        self,
        dht: hivemind.DHT,
        run_id: str,
        identity: Identity,
        *,
        max_ttl: float = DEFAULT_MAX_TTL,
        timeout: float = 30.0,
    ) -> None:
        self.dht = dht
        self.run_id = run_id
        self.identity = identity
        self.timeout = timeout
        self._validator = PulseRecordValidator(run_id, max_ttl)  # the same checks as the DHT process runs

    @classmethod
    def start(cls, config: NetConfig, *, run_id: str, identity: Identity, max_ttl: float = DEFAULT_MAX_TTL) -> PulseDHT:
        """Start the DHT process and its libp2p daemon, and join the swarm via `initial_peers`."""
        validator = PulseRecordValidator(run_id, max_ttl)
        dht = hivemind.DHT(start=False, record_validators=[validator], **config.dht_kwargs())
        try:
            dht.run_in_background(await_ready=True, timeout=config.startup_timeout + 30)
        except Exception as exc:  # hivemind raises plain Exceptions (P2PDaemonError, failed bootstrap)
            dht.shutdown()
            hint = " (are the initial peers running and reachable?)" if config.initial_peers else ""
            raise NetworkError(f"could not start the DHT: {exc}{hint}") from exc
        return cls(dht, run_id, identity, max_ttl=max_ttl)

    @property
    def peer_id(self) -> PeerID:
        return self.dht.peer_id

    def visible_maddrs(self) -> list[str]:
        return [str(addr) for addr in self.dht.get_visible_maddrs()]

    async def replicate_p2p(self) -> P2P:
        """A P2P handle in this process on the DHT's own daemon (for blob streams)."""
        return await self.dht.replicate_p2p()

    def publish(self, message: WireModel, *, ttl: float) -> SignedMessage:
        """Sign `message` and store it; raises `NetworkError` if no peer (nor we) stored it."""
        signed = sign(self.identity, message)
        if not self.store_signed(signed, expiration_time=get_dht_time() + ttl):
            raise NetworkError(f"no peer stored {message.KIND} for round {message.round}")
        return signed

    def store_signed(self, signed: SignedMessage, *, expiration_time: float) -> bool:
        """Store an already signed message under its signer's subkey (also used to relay one)."""
        value = signed.to_bytes()
        if len(value) > MAX_ENVELOPE_BYTES:  # also keeps hivemind's request pipe well under 64 KiB
            raise SizeLimitExceeded(f"signed {signed.kind} is {len(value)} bytes, cap is {MAX_ENVELOPE_BYTES}")
        future = self.dht.store(
            dht_key(signed.run_id, signed.kind, signed.round),
            value,
            expiration_time,
            subkey=signed.sender,
            return_future=True,
        )
        return bool(self._result(future, "store"))

    def get(self, kind: type[M], round_: int) -> list[Verified[M]]:
        """Every valid `kind` record for `round_`, re-verified here, sorted by sender."""
        future = self.dht.get(dht_key(self.run_id, kind.KIND, round_), latest=True, return_future=True)
        found = self._result(future, "get")
        if found is None or not isinstance(found.value, dict):
            return []
        out: list[Verified[M]] = []
        for subkey, entry in found.value.items():
            try:
                out.append(self._reverify(kind, round_, subkey, entry.value, entry.expiration_time))
            except ProtocolError as exc:
                logger.warning("ignored a %s record that failed local checks: %s", kind.KIND, exc)
        return sorted(out, key=lambda v: v.signed.sender)

    def get_new(self, kind: type[M], round_: int, seen: SeenCache) -> list[Verified[M]]:
        """Like `get`, without messages whose id is in `seen` (replays); records the new ones."""
        return [v for v in self.get(kind, round_) if seen.add(v.message_id)]

    def find_providers(self, round_: int, sha256: str) -> list[PeerID]:
        """Peers whose heartbeat for `round_` says they serve blob `sha256`."""
        beats = self.get(Heartbeat, round_)
        return [PeerID.from_base58(v.message.peer_id) for v in beats if sha256 in v.message.blobs]

    def known_peers(self) -> int:
        """Peers in this node's DHT routing table; `NetworkError` if the DHT process does not answer in time."""
        return int(self._result(self.dht.run_coroutine(_routing_table_size, return_future=True), "peer count"))

    def shutdown(self) -> None:
        self.dht.shutdown()

    def _reverify(self, kind: type[M], round_: int, subkey: object, value: object, exp: float) -> Verified[M]:
        return verify_record(self._validator, kind, round_, subkey, value, exp)

    def _result(self, future: MPFuture, what: str) -> Any:
        try:
            return future.result(timeout=self.timeout)
        except TimeoutError as exc:
            future.cancel()
            raise NetworkError(f"DHT {what} did not finish within {self.timeout:.0f}s") from exc


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


def check_store(validator: PulseRecordValidator, signed: SignedMessage, expiration: float) -> Verified[WireModel]:
    """What a DHT peer checks when asked to store `signed` the way `PulseDHT.store_signed` stores it."""
    key = dht_key_id(signed.run_id, signed.kind, signed.round)
    return validator.check(DHTRecord(key, _pack_bin(signed.sender), _pack_bin(signed.to_bytes()), expiration))


def _pack_bin(data: bytes) -> bytes:
    return msgpack.packb(data, use_bin_type=True)
