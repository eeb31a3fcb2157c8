"""The events of auditors and standby validators: rounds recomputed, mismatches found, rounds taken over."""

from __future__ import annotations

from typing import Literal

from node.events.models import Event


class AuditStarted(Event):
    """Where an auditor's FP32 replica starts."""

    event: Literal["audit_start"] = "audit_start"
    round: int
    source: Literal["disk", "initial", "checkpoint"]
    """Its own committed state, W_0 derived from the manifest, or an FP32 checkpoint a signed result names."""
    state_hash: str


class Audited(Event):
    """A round's result recomputed from its public inputs and found true."""

    event: Literal["audited"] = "audited"
    round: int
    signer: str
    """The validator that signed the result."""
    state_hash: str
    """W_{round+1}, now held."""
    aggregated: int
    fetched_bytes: int
    """Payload, evidence and patch bytes fetched for the round."""
    patch_checked: bool
    """The patch was checked (fetched and applied, or re-encoded to the same bytes)."""
    seconds: float
    """Fetching, recomputing and committing the round."""
    compute_seconds: float
    """Of which: decoding, aggregating, stepping, hashing and checking the patch."""


class AuditMismatch(Event):
    """A round's result differs from what its inputs give: the auditor stays on the last verified state."""

    event: Literal["audit_mismatch"] = "audit_mismatch"
    round: int
    signer: str
    findings: list[str]
    """What differs, one line each (`validator.audit.Finding`)."""


class TookOver(Event):
    """A standby validator closed a round the active validator left open past its deadline and grace."""

    event: Literal["took_over"] = "took_over"
    round: int
    previous: str | None
    """The validator that was active (signed the last result), if any."""
    submissions: int
    """Submissions the standby had collected for the round."""
    waited: float
    """Seconds from the round's opening to the takeover."""


class StoodDown(Event):
    """A validator found another validator's result counting for a round it closed (or was about to), and
    continues as a standby."""

    event: Literal["stood_down"] = "stood_down"
    round: int
    by: str
    """The validator whose result counts."""


class Standby(Event):
    """A validator follows the run as a standby (auditing, collecting submissions)."""

    event: Literal["standby"] = "standby"
    round: int
    active: str | None


class Replicated(Event):
    """The active validator handed a round's result to the standbys before publishing it."""

    event: Literal["replicated"] = "replicated"
    round: int
    standbys: int
    """Standbys that announced the round (each was handed the result)."""
    acknowledged: int
    """Of which: holding the result's patch, evidence and payloads when it published (it waits for one)."""
    seconds: float


AUDIT_EVENTS = (AuditStarted, Audited, AuditMismatch, TookOver, StoodDown, Standby, Replicated)
