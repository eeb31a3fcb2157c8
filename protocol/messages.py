"""Wire messages: pydantic v2 models for everything a node signs and publishes.

Every model is `strict=True, extra="forbid", frozen=True`: a peer's bytes either parse into
exactly these fields with these types or are rejected (3.0 is not a round, "1" is not a size).
Lists are tuples with a hard length cap, strings have a pattern or a length cap, hashes are
lowercase hex.

Canonical bytes: JSON of `model_dump(mode="json")` with sorted keys, no whitespace, ASCII only,
no NaN. Floats use Python's shortest round-trip repr. `from_canonical` re-encodes what it parsed
and rejects input that is not byte-identical, so one message has exactly one encoding (the
signature and the replay id are over these bytes). JSON rather than a binary layout because the
bodies are small (<= 48 KiB, they must fit a DHT value) and a readable body helps debugging.

The size caps are chosen so that the largest valid body fits a DHT value (< 64 KiB) inside its
signed envelope with room to spare (hivemind's DHT process reads requests from a pipe and fails on
messages near 64 KiB); `tests/test_messages.py` checks the worst case. A validator with more than
`MAX_REJECTIONS` rejections in a round must publish the full result as a blob.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from protocol.parsing import parse_canonical

PROTOCOL_VERSION = 2
"""The one protocol version: bump it on any change to a wire schema or the signing preimage.
(2: every envelope carries signed freshness, `expires_ms`; a round result commits to what
recomputing its step needs: `RoundResult.evidence` and the rest.)"""

MAX_ROUND = 2**62
MAX_BLOB_BYTES = 2**40  # 1 TiB: larger than any payload, small enough to rule out overflow games
MAX_BODY_BYTES = 48 * 1024
MAX_SELECTED = 64
MAX_REJECTIONS = 128
MAX_REASON_CHARS = 100
MAX_HELD_BLOBS = 64
MAX_POOL_BATCHES = 64

Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""A SHA-256 digest: 64 lowercase hex characters."""
PublicKeyHex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""An Ed25519 public key: 32 bytes as 64 lowercase hex characters."""
PeerIdText = Annotated[str, StringConstraints(pattern=r"^[1-9A-HJ-NP-Za-km-z]{32,128}$")]
"""A libp2p peer id in base58."""
Name = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_.-]{0,31}$")]
"""A short identifier such as a codec or file format name."""
Reason = Annotated[str, StringConstraints(pattern=r"^[\x20-\x7e]+$", max_length=MAX_REASON_CHARS)]
"""A one-line printable ASCII reason, safe to log."""
Round = Annotated[int, Field(ge=0, le=MAX_ROUND)]
ByteSize = Annotated[int, Field(ge=0, le=MAX_BLOB_BYTES)]


class WireModel(BaseModel):
    """A signed message body. `run_id` and `round` also enter the signing preimage."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    KIND: ClassVar[str]

    run_id: Sha256Hex
    """Hash of the run manifest; a message for another run never verifies."""
    round: Round
    """The training round the message is about."""

    def canonical_bytes(self) -> bytes:
        return _dumps(self.model_dump(mode="json"))

    @classmethod
    def from_canonical(cls, data: bytes) -> Self:
        """Parse a body; any schema violation or non-canonical encoding is `MalformedPayload`."""
        return parse_canonical(
            cls, data, what=f"{cls.KIND} body", max_bytes=MAX_BODY_BYTES, encode=lambda m: m.canonical_bytes()
        )


class SubmissionHeader(WireModel):
    """A miner's claim: 'for round r, from state S, here is my payload'. Goes into the DHT."""

    KIND: ClassVar[str] = "submission"

    base_state_hash: Sha256Hex
    """SHA-256 of the BF16 global weights the miner trained from."""
    payload_sha256: Sha256Hex
    """SHA-256 of the compressed pseudo-gradient payload (the blob's name)."""
    payload_size: ByteSize
    """Exact payload length in bytes; a receiver never reads past it."""
    codec: Name
    """Payload codec name, e.g. 'pulseloco' or 'sparseloco'."""
    data_digest: Sha256Hex
    """Digest of the sample ids the miner trained on (its data assignment)."""
    sender: PublicKeyHex
    """The miner's Ed25519 public key; must equal the envelope's signer."""

    @classmethod
    def for_payload(
        cls, *, run_id: str, round_: int, base_hash: str, payload: bytes, codec: str, data_digest: str, sender: str
    ) -> SubmissionHeader:
        """The header naming `payload` (its SHA-256 and exact size)."""
        return cls(
            run_id=run_id,
            round=round_,
            base_state_hash=base_hash,
            payload_sha256=hashlib.sha256(payload).hexdigest(),
            payload_size=len(payload),
            codec=codec,
            data_digest=data_digest,
            sender=sender,
        )


class ScoredSubmission(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    sender: PublicKeyHex
    payload_sha256: Sha256Hex
    score: float = Field(allow_inf_nan=False)
    """Final score the validator ranked by."""


class Rejection(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    sender: PublicKeyHex
    payload_sha256: Sha256Hex
    reason: Reason


class BlobRef(BaseModel):
    """A blob named by its SHA-256, with its exact size (a fetcher never reads past it)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    sha256: Sha256Hex
    size: ByteSize


class OuterStep(BaseModel):
    """The outer optimizer's settings and step count a round's step used (`validator/outer.py`)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    lr: float = Field(gt=0, le=1e6, allow_inf_nan=False)
    momentum: float = Field(ge=0, lt=1, allow_inf_nan=False)
    nesterov: bool
    steps: int = Field(ge=0, le=MAX_ROUND)
    """Outer steps applied before this round's."""


class RoundResult(WireModel):
    """The validator's verdict for a round and the patch that moves everyone to the next state.

    It commits to everything needed to recompute the round's step from public data (an auditor
    does, `validator/audit.py`): the FP32 state before and after, the outer step's settings, and
    the round's evidence blob, which lists the aggregated payloads in order with their norms and
    clip factors and the signed header of every submission the result names.
    """

    KIND: ClassVar[str] = "round_result"

    selected: tuple[ScoredSubmission, ...] = Field(max_length=MAX_SELECTED)
    """Aggregated submissions with their scores, in aggregation order (the sum runs in this order)."""
    rejections: tuple[Rejection, ...] = Field(max_length=MAX_REJECTIONS)
    """Every submission that was not aggregated, with its reason."""
    base_state_hash: Sha256Hex
    """SHA-256 of W_r, the state the patch applies to."""
    patch_sha256: Sha256Hex
    patch_size: ByteSize
    new_state_hash: Sha256Hex
    """SHA-256 of W_{r+1}; a follower checks its patched weights against it."""
    master_before: Sha256Hex
    """SHA-256 (`statehash.py`) of the FP32 state the step reads, before it: the master, and the
    momentum buffers when momentum is on."""
    master_after: Sha256Hex
    """The same after the step (equal to `master_before` when nothing was aggregated)."""
    outer: OuterStep
    """The outer step's settings and the number of steps before this one."""
    evidence: BlobRef
    """The round's evidence blob (`validator/evidence.py`)."""
    master_checkpoint: BlobRef | None
    """The FP32 state after the step as a safetensors blob hashing to `master_after`, every
    `checkpoint_every` rounds: where an auditor can start without replaying from W_0."""

    @model_validator(mode="after")
    def _one_outcome_each(self) -> Self:
        keys = [(s.sender, s.payload_sha256) for s in self.selected]
        keys += [(r.sender, r.payload_sha256) for r in self.rejections]
        if len(keys) != len(set(keys)):
            raise ValueError("a submission has more than one outcome")
        return self


class Standing(BaseModel):
    """A miner's persistent standing with the validator after a round."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    sender: PublicKeyHex
    rating: float = Field(ge=-1e6, le=1e6, allow_inf_nan=False)
    """OpenSkill ordinal (mu - 3 sigma) after the round's match."""
    indicator: float = Field(ge=-1.0, le=1.0, allow_inf_nan=False)
    """Moving average of the own-data indicator (+1: the update helps the miner's own data most)."""


class RoundMetrics(WireModel):
    """What the validator measured in a round, published beside its `RoundResult` for run pages.

    Unlike the result, these figures cannot be checked from the hash chain alone: the held-out
    loss needs the held-out data, the byte counts are what reached the validator. A new kind of
    record, so nodes that do not know it only refuse to store it; `schema_version` numbers its layout so
    that a later one can change it without a new protocol version.
    """

    KIND: ClassVar[str] = "round_metrics"

    schema_version: Literal[1] = 1
    """Layout of this record."""
    held_out_loss: float | None = Field(ge=0, le=1e6, allow_inf_nan=False)
    """Mean next-token loss (nats) of W_{round+1} on the run's held-out batches, if measured."""
    held_out_reward: float | None = Field(ge=-1e6, le=1e6, allow_inf_nan=False)
    """RL runs: mean greedy reward of W_{round+1} on held-out prompts, in the rounds it is measured."""
    submissions: int = Field(ge=0, le=2**31)
    """Submissions that reached the round."""
    received_bytes: ByteSize
    """Payload bytes of those submissions."""
    dense_bytes: ByteSize
    """What as many dense FP32 pseudo-gradients would have been."""
    standings: tuple[Standing, ...] = Field(max_length=MAX_SELECTED + MAX_REJECTIONS)
    """The standing of every miner named in the round's result."""


class CheckpointAnnouncement(WireModel):
    """A full checkpoint of the BF16 global weights after `round`, fetchable as a blob."""

    KIND: ClassVar[str] = "checkpoint"

    state_hash: Sha256Hex
    """SHA-256 of the weights the checkpoint holds (see `statehash.py`)."""
    blob_sha256: Sha256Hex
    blob_size: ByteSize
    format: Name
    """File format of the blob, e.g. 'safetensors'."""
    index_sha256: Sha256Hex | None = None
    """The blob's piece index (`pieces.py`: which bytes are which state chunk), itself a blob:
    with it a joiner fetches pieces from every holder at once and checks each as it arrives."""
    index_size: ByteSize | None = None

    @model_validator(mode="after")
    def _index_named_whole(self) -> Self:
        if (self.index_sha256 is None) != (self.index_size is None):
            raise ValueError("a piece index needs both its SHA-256 and its size")
        return self


HEAD_ROUND = 0
"""The round a `RunHead` is stored under: always this one, so a node that knows nothing of the run
yet finds the head at one fixed key (`dht_key(run, "head", HEAD_ROUND)`)."""


class RunHead(WireModel):
    """Where the run is: the validator's pointer to its round, the head of the hash chain, the latest
    checkpoint and the peer that serves them, re-published every round and on a timer.

    Round results and checkpoint announcements are stored for `record_ttl_seconds` under their own
    round's key, so a node that joins late cannot find the current round by searching from round 0
    once round 0's records are gone. A joiner reads this one record and knows at once where to start:
    the checkpoint, then the round results from the checkpoint's round to `open_round`. Written only by
    the run's validators (readers and DHT peers refuse anyone else's); `sent_at` is its signed freshness:
    a reader keeps the newest head.
    """

    KIND: ClassVar[str] = "head"

    open_round: Round
    """The round the validator is at: it holds W_open_round, and round results exist for every
    earlier round."""
    state_hash: Sha256Hex
    """SHA-256 of W_open_round: the head of the hash chain."""
    checkpoint: CheckpointAnnouncement
    """The newest full checkpoint (its round is at most `open_round`)."""
    validator_peer: PeerIdText
    """The validator's libp2p peer id: it serves the checkpoint and every patch since."""
    sent_at: int = Field(ge=0, le=2**40)
    """When the validator signed this head (unix seconds); the newest head wins."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.round != HEAD_ROUND:
            raise ValueError(f"a head is stored at round {HEAD_ROUND}; its round is `open_round`")
        if self.checkpoint.run_id != self.run_id or self.checkpoint.round > self.open_round:
            raise ValueError("the head's checkpoint is of another run or later than its open round")
        return self


class Heartbeat(WireModel):
    """'I am alive at round r, reachable at this peer id, and I serve these blobs.'"""

    KIND: ClassVar[str] = "heartbeat"

    role: Literal["bootstrap", "miner", "validator", "follower"]
    peer_id: PeerIdText
    """libp2p peer id to open blob streams to."""
    state_hash: Sha256Hex | None
    """SHA-256 of the weights this node holds, if any."""
    blobs: tuple[Sha256Hex, ...] = Field(max_length=MAX_HELD_BLOBS)
    """Blobs this node re-serves, so fetchers can spread over many holders."""
    sent_at: int = Field(ge=0, le=2**40)
    """Sender's unix time in seconds; readers may ignore old heartbeats."""
    target_seconds: float | None = Field(default=None, ge=0, le=86_400, allow_inf_nan=False)
    """A validator opening round r: seconds after `sent_at` by which it expects the round's
    submissions (its adaptive target, or the manifest's deadline); miners size their payloads to it."""


class RolloutAnnouncement(WireModel):
    """An inference worker's rollout batch for `round` (RL runs), fetchable as a blob (`rollouts.py`)."""

    KIND: ClassVar[str] = "rollouts"

    state_hash: Sha256Hex
    """SHA-256 of the BF16 weights the rollouts were generated from (those of `round`)."""
    blob_sha256: Sha256Hex
    blob_size: ByteSize
    groups: int = Field(ge=1, le=MAX_POOL_BATCHES * 4)
    """Prompts in the batch, each with G completions."""
    mean_reward: float = Field(ge=-1e6, le=1e6, allow_inf_nan=False)
    """The worker's claim; the validator recomputes every reward."""


class PoolEntry(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    worker: PublicKeyHex
    round: Round
    """The round whose weights generated the batch."""
    blob_sha256: Sha256Hex
    blob_size: ByteSize


class PoolRejection(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    worker: PublicKeyHex
    blob_sha256: Sha256Hex
    reason: Reason


class RolloutPool(WireModel):
    """The rollout batches miners train on in `round` (RL runs), each checked by the validator."""

    KIND: ClassVar[str] = "rollout_pool"

    entries: tuple[PoolEntry, ...] = Field(min_length=1, max_length=MAX_POOL_BATCHES)
    """Checked batches, in the order assignment seeds index them (`seed % len(entries)`)."""
    rejections: tuple[PoolRejection, ...] = Field(max_length=MAX_POOL_BATCHES)
    """Batches the validator refused this round (false rewards, wrong state, wrong prompts...)."""

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        if len({e.blob_sha256 for e in self.entries}) != len(self.entries):
            raise ValueError("a rollout batch is listed twice")
        return self


MESSAGE_TYPES: dict[str, type[WireModel]] = {
    cls.KIND: cls
    for cls in (
        SubmissionHeader,
        RoundResult,
        RoundMetrics,
        CheckpointAnnouncement,
        Heartbeat,
        RolloutAnnouncement,
        RolloutPool,
        RunHead,
    )
}


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
