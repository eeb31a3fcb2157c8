"""The campaign's fast subset: every attack at once against a real swarm, one round of each.

Two honest miners and a follower run 2 rounds beside four hostile processes: one pushing
transport-level attacks (6 keys), one sending malformed, copied, scaled and colluding payloads and
(in round 1) a replay of its own round-0 push (16 keys, one attack each), a sybil flooding
each round from 20 fresh keys, and one attacking the network layer (DHT floods and pinning,
silent and trickling streams, pushes to a miner and a follower: 5 keys). The validator's event
log must give every push exactly one outcome with a reason, none detectable aggregated, and
every network attack must meet the defence it expects in every round it is played.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from node.swarm.campaign.attacks import ATTACKS, NEEDS_HONEST, NETWORK, PAYLOAD, TRAINED, TRANSPORT
from node.swarm.campaign.swarms import Keys, Team, attack_run

pytestmark = pytest.mark.swarm

# a replay resends something its process had stored in an earlier round: it rides with the payload attacks
WIRE = tuple(a for a in TRANSPORT if a != "replay")
PAYLOADS = (*PAYLOAD, *TRAINED, *NEEDS_HONEST, "replay")


def test_every_attack_in_one_swarm(tmp_path: Path) -> None:
    keys = Keys.make(tmp_path / "keys", honest=2, hostile=len(WIRE) + len(PAYLOADS) + 1 + len(NETWORK))
    teams = [
        Team("wire", WIRE, len(WIRE)),
        Team("payloads", PAYLOADS, len(PAYLOADS)),
        Team("sybil", ("sybil",), 1),
        Team("network", NETWORK, len(NETWORK)),
    ]
    report = attack_run(tmp_path / "run", keys, teams, rounds=2, deadline=15.0)
    ledger = report.ledger
    assert not report.crashes, report.crashes
    assert all(report.checks.values()), report.checks
    played = ledger.per_attack()
    assert set(played) == set(ATTACKS), sorted(set(ATTACKS) - set(played))
    assert ledger.unaccounted == 0, [o for o in ledger.outcomes if o.kind == "unaccounted" or not o.logged]
    assert ledger.aggregated(detectable_only=True) == 0, [o for o in ledger.outcomes if o.kind == "aggregated"]
    refusals = {o.attack: o.reason for o in ledger.outcomes if o.kind == "refused" and "BUSY" not in o.reason}
    for attack in TRANSPORT:
        if attack in played:
            assert played[attack]["refused"] == played[attack]["sends"], (attack, played[attack])
            assert attack in refusals, f"{attack} never met its own check (only BUSY answers)"
    for attack in NETWORK:  # every play met its defence (a breach would also count as unaccounted)
        assert played[attack]["refused"] == played[attack]["sends"] > 0, (attack, played[attack])
    for attack in PAYLOAD:  # an oversize body may also be refused on the stream, before it is stored
        stopped = played[attack]["rejected"] + (played[attack]["refused"] if attack == "oversize" else 0)
        assert stopped == played[attack]["sends"], (attack, played[attack])
