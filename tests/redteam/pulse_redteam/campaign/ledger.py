"""One outcome per submission, from the swarm's event logs and the validator's log.

A hostile push ends in exactly one of:

- refused: the validator answered anything but OK on the stream (its log names the message or the
  stream, with the reason), or took it and later gave its seat to another (a `dropped` event
  with the reason);
- late: refused only because the round it named (truthfully: the round the hostile process saw
  open) had closed when it arrived. The validator never judged the attack itself: a campaign whose
  hostile processes, on the honest miners' cores, run behind the rounds plays fewer attacks than
  it claims (`not_played` lists the attacks that were late every time);
- rejected / outscored / aggregated: it was stored and handed to round r, whose `round` event
  lists its sender under `rejections` (with the reason) or `scores` (aggregated);
- voided: the validator that took it was killed before closing the round (the restarted one
  reopens the round; nothing of the killed one counts);
- held: only a standby validator took it, and the active one closed the round: the standby held it
  should it have to close the round itself, and dropped it with the round.

An attack on the network layer (`net_attack` events: DHT floods and pinning, stream-slot holders,
pushes to miners and followers) is refused when its targets did what the attack expects
(`Attack.expect`: every record refused, every stream dropped in time), and breached otherwise;
a breach counts as unaccounted. Anything else is unaccounted. Honest submissions (`received`
events of non-hostile senders) are checked the same way. A round closed twice (by a validator
and its restarted self) is a double count.

A fabricated rollout batch (announced, not pushed) ends in the validator's pools: refused with the
reason, aggregated (taken into a pool: the attack worked), or unused (never taken, never named).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from node.events import EventLog, Logged
from node.events.campaign import AttackSent, NetAttack
from node.events.models import Dropped, PoolPublished, Received, RoundClosed
from pulse_redteam.campaign.attacks import ATTACKS

OUTSCORED = ("score ", "final score", "indicator average", "rating ordinal")
CLOSED = re.compile(r"round \d+ (has closed|is not open)")  # the intake's refusals of a round not open (intake.py)


@dataclass
class Outcome:
    attack: str
    round: int
    sender: str
    kind: str  # refused | late | rejected | outscored | aggregated | voided | held | unused | breached | unaccounted
    reason: str
    logged: bool = True


@dataclass
class Ledger:
    outcomes: list[Outcome] = field(default_factory=list)
    honest_unaccounted: list[str] = field(default_factory=list)
    double_counted: list[int] = field(default_factory=list)
    rounds: dict[int, Logged[RoundClosed]] = field(default_factory=dict)  # the validator's `round` event of each

    @property
    def unaccounted(self) -> int:
        hostile = sum(1 for o in self.outcomes if o.kind in ("unaccounted", "breached") or not o.logged)
        return hostile + len(self.honest_unaccounted) + len(self.double_counted)

    def aggregated(self, detectable_only: bool = False) -> int:
        return sum(
            1 for o in self.outcomes if o.kind == "aggregated" and (not detectable_only or ATTACKS[o.attack].detectable)
        )

    def per_attack(self) -> dict[str, dict[str, Any]]:
        table: dict[str, dict[str, Any]] = {}
        for attack in ATTACKS:
            mine = sorted((o for o in self.outcomes if o.attack == attack), key=lambda o: o.round)
            if not mine:
                continue
            kinds: defaultdict[str, int] = defaultdict(int)
            for o in mine:
                kinds[o.kind] += 1
            aggregated_at = [i for i, o in enumerate(mine) if o.kind == "aggregated"]
            table[attack] = {
                "sends": len(mine),
                "refused": kinds["refused"],
                "late": kinds["late"],
                "rejected": kinds["rejected"],
                "outscored": kinds["outscored"],
                "aggregated": kinds["aggregated"],
                "voided": kinds["voided"],
                "held": kinds["held"],
                "unused": kinds["unused"],
                "breached": kinds["breached"],
                "unaccounted": kinds["unaccounted"] + sum(1 for o in mine if not o.logged),
                # sends of this attack up to its last aggregated one: 0 = excluded from its first send
                "rounds_until_excluded": aggregated_at[-1] + 1 if aggregated_at else 0,
                "reason": next((o.reason for o in mine if o.kind != "aggregated"), ""),
            }
        return table

    def not_played(self) -> list[str]:
        return not_played(self.per_attack())


def not_played(table: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The attacks of a `per_attack` table (one run's, or several merged) whose every push arrived
    after its round had closed: never judged by the validator."""
    return [attack for attack, row in table.items() if row["sends"] and row["late"] == row["sends"]]


def build(log: EventLog, validator_log: str, killed_validators: frozenset[str] = frozenset()) -> Ledger:
    ledger = Ledger()
    for r in log.of(RoundClosed):
        if r.event.round in ledger.rounds:
            ledger.double_counted.append(r.event.round)
        ledger.rounds[r.event.round] = r
    receivers: defaultdict[tuple[int, str], set[str]] = defaultdict(set)  # miners push to every validator
    for got in log.of(Received):
        receivers[(got.event.round, got.event.sender)].add(got.name)
    dropped = {(e.round, e.sender): e.reason for e in log.events(Dropped)}
    pools = log.events(PoolPublished)
    sends = log.events(AttackSent)
    hostile = {send.sender for send in sends}
    for send in sends:
        if send.status in ("ANNOUNCED", "PUSHED"):  # a rollout batch: the pool decides
            ledger.outcomes.append(_pooled(send, pools))
        elif send.status == "OK" and (send.round, send.sender) in dropped:
            reason = f"dropped: {dropped[(send.round, send.sender)]}"
            ledger.outcomes.append(Outcome(send.attack, send.round, send.sender, "refused", reason))
        else:
            ledger.outcomes.append(_outcome(send, ledger.rounds, receivers, killed_validators, validator_log))
    for play in log.events(NetAttack):
        if play.outcome != "skipped":
            kind = "refused" if play.outcome == ATTACKS[play.attack].expect else "breached"
            ledger.outcomes.append(Outcome(play.attack, play.round, play.sender, kind, f"{play.target}: {play.detail}"))
    for (round_, sender), names in receivers.items():
        if sender in hostile or (round_, sender) in dropped:
            continue
        closed = ledger.rounds.get(round_)
        if closed is not None and closed.name in names:
            if (sender in closed.event.scores) == (sender in closed.event.rejections):
                ledger.honest_unaccounted.append(f"round {round_}: {sender[:12]}")
        elif not names <= killed_validators:
            where = "round never closed" if closed is None else f"round closed by {closed.name}, which never took it"
            ledger.honest_unaccounted.append(f"round {round_}: {sender[:12]} received, {where}")
    return ledger


def _outcome(
    send: AttackSent,
    rounds: dict[int, Logged[RoundClosed]],
    receivers: dict[tuple[int, str], set[str]],
    killed: frozenset[str],
    validator_log: str,
) -> Outcome:
    attack, round_, sender = send.attack, send.round, send.sender
    if send.status != "OK":
        logged = send.message_id[:12] in validator_log or f"submit from {send.peer_id}" in validator_log
        late = send.header_round == round_ and CLOSED.search(send.reason) is not None
        return Outcome(
            attack, round_, sender, "late" if late else "refused", f"{send.status} {send.reason}".strip(), logged
        )
    took = receivers.get((round_, sender), set())
    closed = rounds.get(round_)
    if took and took <= killed and (closed is None or closed.name not in took):
        return Outcome(attack, round_, sender, "voided", "its validator was killed before closing the round")
    if closed is None or not took:
        return Outcome(attack, round_, sender, "unaccounted", "stored, but no round outcome", logged=False)
    if closed.name not in took:  # a standby took it; the active validator closed the round without it
        held = ", ".join(sorted(took))
        return Outcome(attack, round_, sender, "held", f"held by {held}; round closed by {closed.name}")
    scores, reason = closed.event.scores, closed.event.rejections.get(sender)
    if (sender in scores) == (reason is not None):
        return Outcome(attack, round_, sender, "unaccounted", "not exactly one outcome in the round", logged=False)
    if reason is None:
        return Outcome(attack, round_, sender, "aggregated", f"score {scores[sender]:.4g}")
    kind = "outscored" if reason.startswith(OUTSCORED) else "rejected"
    return Outcome(attack, round_, sender, kind, reason)


def _pooled(send: AttackSent, pools: list[PoolPublished]) -> Outcome:
    """What the validator's pools (of its round and later) made of an announced rollout batch."""
    later = [p for p in pools if p.round >= send.round]
    if any(send.sender in p.workers for p in later):
        return Outcome(send.attack, send.round, send.sender, "aggregated", "taken into a rollout pool")
    reason = next((p.refused[send.sender] for p in later if send.sender in p.refused), None)
    if reason is not None:
        return Outcome(send.attack, send.round, send.sender, "refused", reason)
    return Outcome(send.attack, send.round, send.sender, "unused", "never taken into a pool, never named")
