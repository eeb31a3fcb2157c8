"""A round's evidence: what recomputing its step and checking its verdicts needs, as one blob.

The signed round result names this blob by SHA-256 and size (`RoundResult.evidence`), so the
evidence binds its signer exactly as the result does, while the result itself stays small enough
for a DHT value. Contents:

    secret       the signature that seeds the round's randomness (`scoring.RoundSecret`), revealed
                 now that the round is closed: anyone checks it against the signer's key and redraws
                 the round's random batches and each miner's tested batch (`pulse receipt`)
    median_norm  the norm gate's reference: updates far above it are rejected, near zero are free riders
                 (in a round no established key sent to, each payload weighs its gain on R per
                 unit of norm in it: `Assessed.median_weight`)
    aggregated   the selected submissions in aggregation order: payload hash and size, the norm the
                 validator measured (float64), and the clip factor min(1, clip_to / norm) it applied
    clip_to      the median of the aggregated norms
    headers      the signed header of every submission the result names (selected, then rejected),
                 so signatures, rounds, base states, sizes and assignments can be checked by anyone
    assessed     each named submission's measured norm, gains and indicator (a miner's receipt)
    book         the validator's book after the round, replay cache left out: ratings, indicator
                 averages, recent state hashes, the outer step count. A standby continues from it.

Encoding: canonical JSON (sorted keys, no whitespace); `from_bytes` parses strictly and rejects a
non-canonical encoding, as wire messages do. Floats round-trip exactly (shortest repr), so the
norms an auditor reads are the norms the validator used.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from protocol.messages import MAX_REJECTIONS, MAX_SELECTED, BlobRef, ByteSize, PublicKeyHex, Sha256Hex
from protocol.parsing import parse_canonical
from protocol.signing import MAX_ENVELOPE_BYTES
from validator.aggregate import Aggregate
from validator.gauntlet import Decision, Outcome
from validator.intake import Submission
from validator.scoring import RoundSecret
from validator.state import Book

MAX_EVIDENCE_BYTES = 256 * 2**20  # a book of a million rated miners fits; a fetcher reads no more
_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)
Finite = Annotated[float, Field(allow_inf_nan=False)]
EnvelopeHex = Annotated[str, StringConstraints(pattern=r"^([0-9a-f]{2})+$", max_length=2 * MAX_ENVELOPE_BYTES)]
SignatureHex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{128}$")]


class Aggregated(BaseModel):
    """One aggregated submission, in aggregation order."""

    model_config = _STRICT

    sender: PublicKeyHex
    payload_sha256: Sha256Hex
    payload_size: ByteSize
    norm: Finite = Field(ge=0)
    """Global L2 norm of the decoded update (float64), as the validator measured it."""
    clip: Finite = Field(gt=0, le=1)
    """The factor the update was multiplied by before averaging: min(1, clip_to / norm)."""


class Assessed(BaseModel):
    """What the validator measured of one named submission (None where it was not measured)."""

    model_config = _STRICT

    sender: PublicKeyHex
    payload_sha256: Sha256Hex
    norm: Finite | None
    gains: tuple[Finite, Finite, Finite, Finite] | None
    """(gain on its assigned batch, on the random batches, the reference update's on each): `scoring.Gains`."""
    indicator: Literal[-1, 0, 1]
    final: Finite | None
    """Rating strength (exp(ordinal / beta)) x max(indicator average, 0), the score selection ranked by."""
    median_weight: Finite | None = Field(default=None, ge=0)
    """In a round no established key sent to: the payload's weight in the norm gate's median, its gain
    on the random batches per unit of norm, or 0 (`gauntlet.RoundPipeline._median_weights`); None otherwise."""


class RoundEvidence(BaseModel):
    model_config = _STRICT

    schema_version: Literal[1] = 1
    run_id: Sha256Hex
    round: int = Field(ge=0)
    secret: SignatureHex
    median_norm: Finite = Field(ge=0)
    clip_to: Finite = Field(ge=0)
    aggregated: tuple[Aggregated, ...] = Field(max_length=MAX_SELECTED)
    headers: tuple[EnvelopeHex, ...] = Field(max_length=MAX_SELECTED + MAX_REJECTIONS)
    assessed: tuple[Assessed, ...] = Field(max_length=MAX_SELECTED + MAX_REJECTIONS)
    book: Book

    def to_bytes(self) -> bytes:
        return _dumps(self.model_dump(mode="json"))

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        """Parse an evidence blob; `MalformedPayload` for anything but the canonical encoding of one."""
        return parse_canonical(cls, data, what="evidence", max_bytes=MAX_EVIDENCE_BYTES, encode=lambda m: m.to_bytes())

    def ref(self) -> BlobRef:
        data = self.to_bytes()
        return BlobRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data))

    def assessed_of(self, sender: str) -> Assessed | None:
        return next((a for a in self.assessed if a.sender == sender), None)


def build_evidence(
    run_id: str,
    round_: int,
    secret: RoundSecret,
    decision: Decision,
    aggregated: Aggregate | None,
    submissions: Sequence[Submission],
    book: Book,
) -> RoundEvidence:
    """The evidence of a decided and aggregated round; `book` is the validator's next book."""
    norms, clips = (aggregated.norms, aggregated.scales) if aggregated is not None else ([], [])
    entries = tuple(
        Aggregated(
            sender=a.sender,
            payload_sha256=a.candidate.header.payload_sha256,
            payload_size=a.candidate.header.payload_size,
            norm=norm,
            clip=clip,
        )
        for a, norm, clip in zip(decision.selected, norms, clips, strict=True)
    )
    outcomes = {o.index: o for o in decision.outcomes}
    named = [a.index for a in decision.selected] + [o.index for o in decision.outcomes if o.status == "rejected"]
    return RoundEvidence(
        run_id=run_id,
        round=round_,
        secret=secret.signature.hex(),
        median_norm=decision.median_norm,
        clip_to=aggregated.clip_to if aggregated is not None else 0.0,
        aggregated=entries,
        headers=tuple(submissions[i].envelope.hex() for i in named),
        assessed=tuple(_assessed(outcomes[i]) for i in named),
        book=public_book(book),
    )


def _assessed(o: Outcome) -> Assessed:
    g = o.gains
    gains = (g.assigned, g.random, g.assigned_ref, g.random_ref) if g is not None else None
    return Assessed(
        sender=o.sender or "",
        payload_sha256=o.payload_sha256 or "",
        norm=o.norm,
        # a diverged loss (an infinite gain) is left unmeasured
        gains=gains if gains is not None and all(math.isfinite(x) for x in gains) else None,
        indicator=1 if o.indicator > 0 else -1 if o.indicator < 0 else 0,
        final=o.final,
        median_weight=o.median_weight,
    )


def public_book(book: Book) -> Book:
    """The book as published: without the replay cache (a submission names its round, and a round
    closes once, so a replay from an earlier round is refused by its round alone)."""
    return book.model_copy(update={"seen": []})


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
