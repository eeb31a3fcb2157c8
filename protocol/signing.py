"""Signed envelopes: domain-separated Ed25519 signatures, message ids and replay detection.

Preimage (what the sender signs; integers big-endian, variable fields length-prefixed):

    b"pulse/signed-message\\x00" | version u16 | len u8, kind | run id (32 bytes) | round u64
    | expires u64 | sender key (32 bytes) | len u32, canonical body

A signature made for another protocol version, run, kind, round or sender never verifies,
because each of them is in the preimage. The message id is the SHA-256 of the preimage: it
names the message independently of how the envelope travelled, so a replay has the same id.

`expires` is the signed freshness of a record: the unix time in milliseconds until which the
signer wants it kept (0: not meant for the DHT, e.g. a header pushed over a stream). A DHT
record must expire exactly then (`node/net/dht.py`), so nobody can keep an owner's old record
alive longer than it asked, and of two records of one owner the one signed later (expiring
later) wins on every peer, by hivemind's own rule (the later expiration is kept).

Envelope (what travels; the same fields framed, then the signature):

    b"PLSM" | version u16 | len u8, kind | run id | round u64 | expires u64 | sender | len u32, body
    | signature (64)
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from protocol.errors import MalformedPayload, ReplayedMessage, SizeLimitExceeded, UnknownVersion, WrongRun
from protocol.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, verify_signature
from protocol.messages import MAX_BODY_BYTES, MESSAGE_TYPES, PROTOCOL_VERSION, WireModel
from protocol.wire import Reader

DOMAIN = b"pulse/signed-message\x00"
MAGIC = b"PLSM"
MAX_KIND_CHARS = 32
MAX_ENVELOPE_BYTES = MAX_BODY_BYTES + 256  # body plus the fixed fields, well under 64 KiB
_KIND_RE = re.compile(rb"[a-z_]{1,%d}" % MAX_KIND_CHARS)

M = TypeVar("M", bound=WireModel)


@dataclass(frozen=True)
class SignedMessage:
    """A body with its signature. Parsing one proves nothing; `open` verifies it."""

    kind: str
    run_id: str  # 64 hex
    round: int
    sender: bytes  # 32-byte Ed25519 public key
    body: bytes  # canonical body bytes
    signature: bytes
    version: int = PROTOCOL_VERSION
    expires_ms: int = 0  # signed freshness: unix milliseconds the signer wants the record kept until

    @property
    def expires_at(self) -> float:
        """`expires_ms` in seconds, the DHT expiration a record of this message must carry."""
        return self.expires_ms / 1000

    @property
    def sender_hex(self) -> str:
        return self.sender.hex()

    def preimage(self) -> bytes:
        return DOMAIN + self._fields()

    @property
    def message_id(self) -> str:
        return hashlib.sha256(self.preimage()).hexdigest()

    @property
    def statement_id(self) -> str:
        """What was said and by whom, whatever its freshness: the same for a record signed afresh
        (a republished round result) as for the original; two results for one round differ in it."""
        return hashlib.sha256(
            b"".join([self.kind.encode("ascii"), bytes.fromhex(self.run_id), self.sender, self.body])
        ).hexdigest()

    def to_bytes(self) -> bytes:
        return MAGIC + self._fields() + self.signature

    def _fields(self) -> bytes:
        kind = self.kind.encode("ascii")
        return b"".join(
            [
                struct.pack(">HB", self.version, len(kind)),
                kind,
                bytes.fromhex(self.run_id),
                struct.pack(">QQ", self.round, self.expires_ms),
                self.sender,
                struct.pack(">I", len(self.body)),
                self.body,
            ]
        )

    @classmethod
    def from_bytes(cls, data: bytes, max_bytes: int = MAX_ENVELOPE_BYTES) -> SignedMessage:
        """Parse an envelope's framing (no signature check). Bad framing is a `MalformedPayload`."""
        if len(data) > max_bytes:
            raise SizeLimitExceeded(f"signed message is {len(data)} bytes, cap is {max_bytes}")
        reader = Reader(data, "signed message")
        if bytes(reader.raw(len(MAGIC))) != MAGIC:
            raise MalformedPayload("not a pulse signed message (bad magic)")
        version, kind_len = reader.unpack(">HB")
        if version != PROTOCOL_VERSION:
            raise UnknownVersion(f"protocol version {version}, this node speaks {PROTOCOL_VERSION}")
        kind_bytes = bytes(reader.raw(kind_len))
        if not _KIND_RE.fullmatch(kind_bytes):
            raise MalformedPayload(f"message kind {kind_bytes!r} is not a valid kind name")
        kind = kind_bytes.decode("ascii")
        run_id = bytes(reader.raw(32)).hex()
        round_, expires_ms = reader.unpack(">QQ")
        sender = bytes(reader.raw(PUBLIC_KEY_BYTES))
        (body_len,) = reader.unpack(">I")
        if body_len > MAX_BODY_BYTES:
            raise SizeLimitExceeded(f"message body is {body_len} bytes, cap is {MAX_BODY_BYTES}")
        body = bytes(reader.raw(body_len))
        signature = bytes(reader.raw(SIGNATURE_BYTES))
        reader.expect_end()
        return cls(kind, run_id, round_, sender, body, signature, version, expires_ms)

    def open(self, *, run_id: str, expect: type[M]) -> M:
        """Verify and parse: wrong run, unknown kind, bad signature or bad body all raise.

        The envelope's run, round and sender must agree with the body's own fields.
        """
        if self.run_id != run_id:
            raise WrongRun(f"message for run {self.run_id[:12]}..., this node is on run {run_id[:12]}...")
        if self.kind != expect.KIND:
            raise MalformedPayload(f"expected a {expect.KIND} message, got kind {self.kind!r}")
        verify_signature(self.sender, self.preimage(), self.signature)
        message = expect.from_canonical(self.body)
        if message.run_id != self.run_id or message.round != self.round:
            raise MalformedPayload("envelope and body disagree on run or round")
        if getattr(message, "sender", self.sender_hex) != self.sender_hex:
            raise MalformedPayload("body names a different sender than the signer")
        return message


@dataclass(frozen=True)
class Verified(Generic[M]):
    """A message whose signature, run and schema were checked."""

    signed: SignedMessage
    message: M

    @property
    def sender_hex(self) -> str:
        return self.signed.sender_hex

    @property
    def message_id(self) -> str:
        return self.signed.message_id

    @property
    def statement_id(self) -> str:
        return self.signed.statement_id


def sign(identity: Identity, message: WireModel, *, expires_ms: int = 0) -> SignedMessage:
    """Sign `message` under its own kind, run and round, to be kept until `expires_ms` (see above)."""
    if not 0 <= expires_ms < 2**63:
        raise ValueError(f"expires_ms {expires_ms} is not a unix time in milliseconds")
    unsigned = SignedMessage(
        kind=message.KIND,
        run_id=message.run_id,
        round=message.round,
        sender=identity.public_key,
        body=message.canonical_bytes(),
        signature=b"",
        expires_ms=expires_ms,
    )
    return replace(unsigned, signature=identity.sign(unsigned.preimage()))


def open_signed(data: bytes, *, run_id: str, expect: type[M]) -> Verified[M]:
    """Parse and verify envelope bytes from a peer."""
    signed = SignedMessage.from_bytes(data)
    return Verified(signed, signed.open(run_id=run_id, expect=expect))


def open_any(data: bytes, *, run_id: str) -> Verified[WireModel]:
    """Like `open_signed`, for a kind taken from the envelope (it must be a known kind)."""
    return open_parsed(SignedMessage.from_bytes(data), run_id=run_id)


def open_parsed(signed: SignedMessage, *, run_id: str) -> Verified[WireModel]:
    """`open_any` for an envelope already parsed (its framing checked by `SignedMessage.from_bytes`)."""
    expect = MESSAGE_TYPES.get(signed.kind)
    if expect is None:
        raise MalformedPayload(f"unknown message kind {signed.kind!r}")
    return Verified(signed, signed.open(run_id=run_id, expect=expect))


class SeenCache:
    """Ids of messages already accepted, oldest evicted first once `capacity` is reached.

    Bounded so a flood cannot grow it without limit; a replay older than the cache's memory is
    still caught by the caller's round check (`StaleRound`). `ids()` lists the ids oldest first,
    so a restarting node can rebuild the cache from disk.
    """

    def __init__(self, capacity: int = 100_000, ids: Iterable[str] = ()) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()
        for message_id in ids:
            self.add(message_id)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, message_id: str) -> bool:
        """Record `message_id`; False if it was already there (a replay)."""
        if message_id in self._ids:
            return False
        self._ids[message_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
        return True

    def check(self, signed: SignedMessage) -> None:
        """Record `signed`, or raise `ReplayedMessage` if it was seen before."""
        if not self.add(signed.message_id):
            raise ReplayedMessage(f"message {signed.message_id[:12]}... was already seen")

    def ids(self) -> list[str]:
        return list(self._ids)
