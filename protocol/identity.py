"""Ed25519 application identities (PyNaCl) and the text format of a key file.

A node's identity is an Ed25519 key pair; its public key (32 bytes, 64 hex characters on the
wire) names it in every signed message and DHT subkey. The libp2p peer id is a separate,
transport-level identity that hivemind keeps.

Key file format (ASCII, three lines; the public key line lets a load detect a corrupted seed):

    pulse-ed25519-v1
    seed <64 hex>
    public <64 hex>

This module only encodes and decodes those bytes; reading and writing the file (mode 0600,
atomic, never overwriting) is `node/net/keyfile.py`, since `protocol` does no I/O.
"""

from __future__ import annotations

import binascii

import nacl.exceptions
import nacl.signing

from protocol.errors import InvalidSignature, KeyFileError

PUBLIC_KEY_BYTES = 32
SEED_BYTES = 32
SIGNATURE_BYTES = 64
KEY_FILE_HEADER = "pulse-ed25519-v1"
MAX_KEY_FILE_BYTES = 1024  # a valid file is ~170 bytes; anything far larger is not ours


class Identity:
    """An Ed25519 signing key. Holds the secret: never log or serialize it outside a key file."""

    def __init__(self, signing_key: nacl.signing.SigningKey) -> None:
        self._signing_key = signing_key
        self.public_key: bytes = bytes(signing_key.verify_key)

    @classmethod
    def generate(cls) -> Identity:
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        if len(seed) != SEED_BYTES:
            raise KeyFileError(f"an Ed25519 seed is {SEED_BYTES} bytes, got {len(seed)}")
        return cls(nacl.signing.SigningKey(seed))

    @property
    def public_hex(self) -> str:
        return self.public_key.hex()

    def sign(self, data: bytes) -> bytes:
        """The 64-byte detached signature of `data`."""
        return self._signing_key.sign(data).signature

    def __repr__(self) -> str:
        return f"Identity(public={self.public_hex[:16]}...)"


def verify_signature(public_key: bytes, data: bytes, signature: bytes) -> None:
    """Raise `InvalidSignature` unless `signature` is `public_key`'s signature of `data`."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        raise InvalidSignature("public key or signature has the wrong length")
    try:
        nacl.signing.VerifyKey(public_key).verify(data, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError) as exc:
        raise InvalidSignature("signature does not verify under the sender's key") from exc


def encode_key_file(identity: Identity) -> bytes:
    seed = bytes(identity._signing_key)  # the 32-byte seed, the only secret
    return f"{KEY_FILE_HEADER}\nseed {seed.hex()}\npublic {identity.public_hex}\n".encode("ascii")


def decode_key_file(data: bytes, source: str = "key file") -> Identity:
    """Parse a key file's bytes; every way it can be wrong is a `KeyFileError` naming `source`."""
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{source}: {len(data)} bytes is too large for a pulse key file")
    try:
        lines = data.decode("ascii").splitlines()
    except UnicodeDecodeError as exc:
        raise KeyFileError(f"{source}: not a pulse key file (not ASCII text)") from exc
    if len(lines) != 3 or lines[0] != KEY_FILE_HEADER:
        raise KeyFileError(f"{source}: not a pulse key file (expected a '{KEY_FILE_HEADER}' header)")
    seed = _hex_field(lines[1], "seed", SEED_BYTES, source)
    public = _hex_field(lines[2], "public", PUBLIC_KEY_BYTES, source)
    identity = Identity.from_seed(seed)
    if identity.public_key != public:
        raise KeyFileError(f"{source}: corrupt (the seed does not match the stored public key)")
    return identity


def _hex_field(line: str, name: str, length: int, source: str) -> bytes:
    label, _, value = line.partition(" ")
    if label != name:
        raise KeyFileError(f"{source}: corrupt (expected a '{name}' line)")
    try:
        raw = binascii.unhexlify(value)
    except (binascii.Error, ValueError) as exc:
        raise KeyFileError(f"{source}: corrupt ({name} is not hex)") from exc
    if len(raw) != length:
        raise KeyFileError(f"{source}: wrong length ({name} is {len(raw)} bytes, expected {length})")
    return raw
