"""Intake: the cheap checks on a round's submissions, before anything is decoded.

Each submission (signed header envelope + payload, or the file holding it) becomes a `Candidate` or a
`Refusal` with a reason. Checks run in this order, and where a submission fails decides what
its outcome may say about its sender:

    1. envelope framing, run, signature, body schema   not provably the sender's:  ignored
    2. round (stale or future), replay of a seen id     a replay is anyone's:        ignored
    3. a second submission from the same key            the first one counts:        ignored
    4. more than `max_submissions` senders              the round is full:           ignored
       (a backstop: the validator service seats at most that many, `admission.py`)
    5. codec, base state hash (behind / unknown), size, payload hash, data digest
                                                         the sender's own doing:      named, penalized

'Ignored' refusals are logged locally only: naming an unverified sender in the signed round
result would let anyone put words in the validator's mouth, and extra messages from one sender
must not grow the result past its caps (`max_submissions` <= `MAX_REJECTIONS`). 'Named' ones
appear in the signed result and rank their sender last in the round's rating match.

Intake changes nothing: the message ids it returns enter the replay cache when the round commits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from protocol.assignment import Assignment
from protocol.errors import ProtocolError
from protocol.messages import SubmissionHeader
from protocol.signing import SeenCache, SignedMessage

_REASON_CHARS = 100


Payload = bytes | Path
"""A payload, or the file that holds it: the validator keeps received payloads on disk and reads
one only to decode it, so a round's memory does not grow with its senders' bytes."""


def read_payload(payload: Payload) -> bytes:
    return payload.read_bytes() if isinstance(payload, Path) else payload


def payload_size(payload: Payload) -> int:
    return payload.stat().st_size if isinstance(payload, Path) else len(payload)


def payload_sha256(payload: Payload) -> str:
    """SHA-256 of the payload, read from its file in blocks (never whole into memory)."""
    if not isinstance(payload, Path):
        return hashlib.sha256(payload).hexdigest()
    with payload.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass(frozen=True)
class Submission:
    """What arrived for a round: the signed header envelope and the payload it names."""

    envelope: bytes
    payload: Payload

    def read(self) -> bytes:
        return read_payload(self.payload)


@dataclass(frozen=True)
class Candidate:
    """A submission that passed intake: signed by its sender, for this round and state."""

    index: int  # position in the round's input
    header: SubmissionHeader
    message_id: str
    source: Payload

    @property
    def sender(self) -> str:
        return self.header.sender

    @property
    def payload(self) -> bytes:
        """The payload bytes, read again from disk each time when it is kept there."""
        return read_payload(self.source)


@dataclass(frozen=True)
class Refusal:
    """A submission that will not be aggregated, and why."""

    index: int
    reason: str
    sender: str | None = None
    payload_sha256: str | None = None
    named: bool = False  # listed in the signed round result; its sender ranks last in the rating match


@dataclass(frozen=True)
class RoundContext:
    """What intake checks a submission against."""

    run_id: str
    round: int
    state_hash: str  # SHA-256 of W_r, the only base accepted
    earlier_states: Mapping[str, int]  # SHA-256 of an earlier state -> its round
    codec: str
    assignment_batches: int
    max_payload_bytes: int
    max_submissions: int


@dataclass
class Screened:
    candidates: list[Candidate] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)  # to remember once the round commits
    senders: list[str] = field(default_factory=list)  # signed senders of this round (one entry each)
    total: int = 0  # submissions screened: every index below this is a candidate or a refusal


def reason_text(text: str) -> str:
    """One printable-ASCII line of at most 100 characters, safe for a wire `Reason`."""
    clean = "".join(ch if " " <= ch <= "~" else "?" for ch in text.replace("\n", " ")).strip() or "rejected"
    return clean if len(clean) <= _REASON_CHARS else clean[: _REASON_CHARS - 3] + "..."


def screen(submissions: Sequence[Submission], ctx: RoundContext, seen: SeenCache) -> Screened:
    """Sort the round's submissions into candidates and refusals, in arrival order."""
    out = Screened()
    ids_this_round: set[str] = set()
    for index, sub in enumerate(submissions):
        verdict = _screen_one(index, sub, ctx, seen, ids_this_round, out)
        if isinstance(verdict, Candidate):
            out.candidates.append(verdict)
        else:
            out.refusals.append(verdict)
    out.total = len(submissions)
    return out


def _screen_one(
    index: int, sub: Submission, ctx: RoundContext, seen: SeenCache, ids: set[str], out: Screened
) -> Candidate | Refusal:
    try:
        signed = SignedMessage.from_bytes(sub.envelope)
    except ProtocolError as exc:
        return Refusal(index, reason_text(f"bad envelope: {exc}"))
    claimed = signed.sender_hex
    try:
        header = signed.open(run_id=ctx.run_id, expect=SubmissionHeader)
    except ProtocolError as exc:
        return Refusal(index, reason_text(f"{type(exc).__name__}: {exc}"), claimed)
    if header.round != ctx.round:
        when = "stale" if header.round < ctx.round else "future"
        return Refusal(index, f"{when} round {header.round}, this is round {ctx.round}", claimed)
    message_id = signed.message_id
    if message_id in seen or message_id in ids:
        return Refusal(index, f"replay of message {message_id[:12]}", claimed, header.payload_sha256)
    ids.add(message_id)
    out.message_ids.append(message_id)
    if claimed in out.senders:
        return Refusal(index, "second submission from this key this round", claimed, header.payload_sha256)
    if len(out.senders) >= ctx.max_submissions:
        return Refusal(index, f"round is full ({ctx.max_submissions} submissions)", claimed, header.payload_sha256)
    out.senders.append(claimed)
    problem = _check_claims(header, sub.payload, ctx)
    if problem:
        return Refusal(index, problem, claimed, header.payload_sha256, named=True)
    return Candidate(index, header, message_id, sub.payload)


def _check_claims(header: SubmissionHeader, payload: Payload, ctx: RoundContext) -> str | None:
    """The reason a signed, current submission cannot be evaluated, or None."""
    problem = check_header(header, ctx)
    if problem:
        return problem
    size = payload_size(payload)
    if size != header.payload_size:
        return f"payload is {size} bytes, header says {header.payload_size}"
    if payload_sha256(payload) != header.payload_sha256:
        return "payload SHA-256 differs from the header's"
    return None


def check_header(header: SubmissionHeader, ctx: RoundContext) -> str | None:
    """The claims of a current header that fail before its body is read (codec, base state, size, data
    digest), or None. The validator's intake refuses on them before the body; `screen` again after."""
    if header.codec != ctx.codec:
        return reason_text(f"codec {header.codec}, this run uses {ctx.codec}")
    if header.base_state_hash != ctx.state_hash:
        behind = ctx.earlier_states.get(header.base_state_hash)
        if behind is not None:
            return f"behind: trained from the state of round {behind}, {ctx.round - behind} rounds old"
        return f"unknown base state {header.base_state_hash[:12]}"
    if header.payload_size > ctx.max_payload_bytes:
        return f"oversize: {header.payload_size} bytes announced, cap is {ctx.max_payload_bytes}"
    expected = Assignment(ctx.run_id, ctx.round, header.sender, ctx.assignment_batches).digest
    if header.data_digest != expected:
        return "data digest does not match the miner's assignment"
    return None
