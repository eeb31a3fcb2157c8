"""One exception tree for everything pulse rejects.

Peer bytes that fail a check raise a subclass of `ProtocolError`; the caller turns it into a
logged rejection with `str(exc)` as the reason. Library errors (zstd, nacl) are translated at
the boundary with `raise Mapped(...) from exc`, so callers catch only classes from here.
"""

from __future__ import annotations


class PulseError(Exception):
    """Root of every error pulse raises on purpose."""


# -- local misuse: the caller's own inputs are wrong ------------------------------------------


class IncompatibleStates(PulseError, ValueError):
    """Two state dicts do not have the same names, shapes and dtypes."""


class UnsupportedDtype(PulseError, TypeError):
    """A tensor dtype the codec does not handle."""


class ConfigError(PulseError, ValueError):
    """A run manifest or option is invalid; the message names the field."""


class NonFiniteUpdate(PulseError, ValueError):
    """A local pseudo-gradient or error-feedback buffer has NaN or inf values (training diverged)."""


class KeyFileError(PulseError):
    """An identity key file is missing, corrupt, the wrong length or readable by others."""


class CorruptState(PulseError):
    """The validator's saved state is missing, unreadable or inconsistent with itself."""


class Superseded(PulseError):
    """Another validator's result counts for a round this validator closed (or is closing): it stands
    down and continues as a standby (`node/roles/standby.py`)."""

    def __init__(self, round_: int, by: str) -> None:
        super().__init__(f"round {round_}: the result of validator {by[:12]} counts")
        self.round, self.by = round_, by


# -- untrusted input: peer bytes that fail a check ---------------------------------------------


class ProtocolError(PulseError):
    """Bytes or a message from a peer failed validation. Nothing was changed."""

    # set on a payload's error when its whole body had been read: decoding its streams had begun,
    # so finding the fault cost about what a decode costs (junk that fails earlier costs little)
    body_read: bool = False


class MalformedPayload(ProtocolError):
    """A payload does not decode under its announced format."""


class UnknownVersion(MalformedPayload):
    """The payload's magic or format version is not one this node speaks."""


class TruncatedPayload(MalformedPayload):
    """The payload ends before its header says it should."""


class TrailingBytes(MalformedPayload):
    """Bytes remain after the last field the header announces."""


class SizeLimitExceeded(MalformedPayload):
    """A declared or actual size is above the announced size or the caller's cap."""


class DecompressionBomb(SizeLimitExceeded):
    """A compressed section expands past the size its header implies."""


class InvalidPositions(MalformedPayload):
    """Sparse positions out of range, duplicated or not in the order the format requires."""


class NonFiniteValues(MalformedPayload):
    """NaN or inf where only finite values are allowed."""


class LayoutMismatch(MalformedPayload):
    """The payload's tensor names, shapes or dtypes differ from the state it targets."""


class StateHashMismatch(ProtocolError):
    """The state a patch applies to, or produces, is not the one its header names."""


class InvalidSignature(ProtocolError):
    """A signature does not verify under the claimed key and domain."""


class WrongRun(ProtocolError):
    """A message belongs to another run."""


class BrokenChain(ProtocolError):
    """Signed round results do not form one hash chain: a gap, a broken link or a signer outside the run."""


class StaleRound(ProtocolError):
    """A message is for a round this node is not accepting."""


class ReplayedMessage(ProtocolError):
    """A message already seen (same id) arrived again."""


class BlobHashMismatch(ProtocolError):
    """A fetched blob's SHA-256 is not the one it was requested by."""


class InvalidRecord(ProtocolError):
    """A DHT record breaks a rule of its key: wrong key, a kind its signer may not write, over its
    size cap, or an expiration other than the signed one."""


# -- the network: peers and daemons that fail, refuse or go silent -----------------------------


class NetworkError(PulseError):
    """The DHT or the libp2p daemon could not start, reach its peers or answer in time."""


class TransferError(NetworkError):
    """A blob transfer failed: the peer vanished, stalled or refused. Nothing was stored."""


class TransferTimeout(TransferError):
    """A peer sent nothing for longer than the per-chunk timeout."""


class BlobNotFound(TransferError):
    """The peer (or the local store) does not hold the requested blob."""


class PeerBusy(TransferError):
    """The peer has no free slot right now (it answered BUSY): trying again later may succeed."""
