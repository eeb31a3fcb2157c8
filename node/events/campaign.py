"""The events of a hostile miner process (the red team's, `tests/redteam/`), read by its campaign ledger."""

from __future__ import annotations

from typing import Literal

from node.events.models import Event


class AttackSent(Event):
    """One hostile push and what the validator answered on the stream."""

    event: Literal["attack"] = "attack"
    round: int
    attack: str
    sender: str
    header_round: int
    """The round the signed header names (an attack may lie about it)."""
    message_id: str
    payload_sha256: str
    status: str
    """The validator's answer: OK (stored and handed to the round) or the refusal's status name."""
    reason: str
    body_sent: bool
    peer_id: str
    """The hostile process's libp2p peer id (the validator logs refusals by it)."""


class Uploading(Event):
    """A hostile push started sending its body."""

    event: Literal["uploading"] = "uploading"
    round: int
    attack: str
    sender: str


class AttackSkipped(Event):
    event: Literal["skipped"] = "skipped"
    round: int
    attack: str
    sender: str
    reason: str


class NetAttack(Event):
    """One attack on the network layer (DHT records, stream slots, pushes to non-validators) and
    what the targets did about it, as the hostile process observed it."""

    event: Literal["net_attack"] = "net_attack"
    round: int
    attack: str
    sender: str
    target: str
    """Who was attacked: 'dht', 'validator', 'miner' or 'follower'."""
    outcome: str
    """'refused' (every target refused), 'dropped' (the target hung up in time), 'breached' (it
    did not: a defence failed), or 'skipped' (nothing to attack this round)."""
    detail: str
    seconds: float = 0.0
    """For stream attacks: the longest a stream was held open before the target hung up."""


class HostileDone(Event):
    event: Literal["hostile_final"] = "hostile_final"
    round: int
    state_hash: str


CAMPAIGN_EVENTS = (AttackSent, Uploading, AttackSkipped, NetAttack, HostileDone)
