"""The campaign's fast subset: every attack against a real swarm.

Two honest miners and a follower run 2 rounds beside four hostile processes: one pushing
transport-level attacks (6 keys), one sending malformed, copied, scaled and colluding payloads and
(in round 1) a replay of its own round-0 push (16 keys, one attack each), a sybil flooding
each round from 20 fresh keys, and one attacking the network layer (DHT floods and pinning,
silent and trickling streams, pushes to a miner and a follower: 5 keys). The validator's event
log must give every push exactly one outcome with a reason, none detectable aggregated, and
every network attack must meet the defence it expects in every round it is played. The attacks
played in a swarm of their own (`SCENARIOS`) follow: a flood of more fresh keys than a round has
seats, and on the RL preset fabricated rollout pools and tiny dense payloads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from node.events import read_events
from node.events.models import PoolPublished, RoundClosed
from node.learn.rl.warmstart import warm_start
from pulse_redteam.campaign.attacks import (
    ATTACKS,
    FLOOD,
    NEEDS_HONEST,
    NETWORK,
    PAYLOAD,
    SCENARIOS,
    STANDING,
    TRAINED,
    TRANSPORT,
)
from pulse_redteam.campaign.swarms import Keys, Team, attack_run, rl_campaign_manifest

pytestmark = pytest.mark.swarm

# a replay resends something its process had stored in an earlier round: it rides with the payload attacks
WIRE = tuple(a for a in TRANSPORT if a != "replay")
PAYLOADS = (*PAYLOAD, *TRAINED, *NEEDS_HONEST, "replay")
# hostile processes heartbeat as miners without submitting, so each RL round waits out its deadline:
# the pool takes about 6 s to build and the submissions arrive about 3 s after the open on two cores
RL_DEADLINE = 15.0


def test_every_attack_in_one_swarm(tmp_path: Path) -> None:
    keys = Keys.make(tmp_path / "keys", honest=2, hostile=len(WIRE) + len(PAYLOADS) + 1 + len(NETWORK) + len(STANDING))
    teams = [
        Team("wire", WIRE, len(WIRE)),
        Team("payloads", PAYLOADS, len(PAYLOADS)),
        Team("sybil", ("sybil",), 1),
        Team("network", NETWORK, len(NETWORK)),
        Team("standing", STANDING, len(STANDING)),
    ]
    # every round open its whole deadline: the validator waits only for keys whose updates it aggregated,
    # and the payload team (17 keys, training for some, on the honest miners' two cores) sends its
    # last attacks 12 to 15 s after a round opens; the copies and ALIE need the round's honest payloads
    report = attack_run(tmp_path / "run", keys, teams, rounds=2, deadline=15.0, min_seconds=15.0)
    ledger = report.ledger
    assert not report.crashes, report.crashes
    assert all(report.checks.values()), report.checks
    played = ledger.per_attack()
    expected = set(ATTACKS) - set(SCENARIOS)
    # slices of the public step need one: they send nothing until a round has moved the weights
    assert set(played) <= expected and expected - set(played) <= {"public-slice", "median-whisper"}, sorted(
        expected - set(played)
    )
    assert ledger.unaccounted == 0, [o for o in ledger.outcomes if o.kind == "unaccounted" or not o.logged]
    assert ledger.aggregated(detectable_only=True) == 0, [
        (o.attack, o.round, o.sender[:12], o.reason) for o in ledger.outcomes if o.kind == "aggregated"
    ]
    refusals = {o.attack: o.reason for o in ledger.outcomes if o.kind == "refused" and "BUSY" not in o.reason}
    for attack in TRANSPORT:
        if attack in played:
            # refused on the stream; a push the hostile process sent after its round closed is late
            assert played[attack]["refused"] + played[attack]["late"] == played[attack]["sends"], (
                attack,
                played[attack],
            )
            assert attack in refusals, f"{attack} never met its own check (only BUSY answers)"
    for attack in NETWORK:  # every play met its defence (a breach would also count as unaccounted)
        assert played[attack]["refused"] == played[attack]["sends"] > 0, (attack, played[attack])
    # a body that is no payload (a zstd bomb, a NaN in a header, trailing bytes) is refused as it lands
    # and one that frames whole is rejected once decoded; an oversize header is refused before its body
    for attack in PAYLOAD:
        stopped = played[attack]["rejected"] + played[attack]["refused"]
        assert stopped == played[attack]["sends"], (attack, played[attack])
    refused = [(o.attack, o.reason) for o in ledger.outcomes if o.attack in PAYLOAD and o.kind == "refused"]
    assert all("undecodable" in why or "oversize" in why for _, why in refused), refused


def test_a_flood_of_more_fresh_keys_than_seats(tmp_path: Path) -> None:
    """160 fresh keys a round against 128 seats: every push is seated or refused with a reason (on
    the stream: not drawn, or its random bytes refused as they landed, which frees the seat; or a
    seat given to a lower ticket), no round takes more than its seats, and the honest miners'
    submissions all have an outcome; nothing is silently ignored."""
    keys = Keys.make(tmp_path / "keys", honest=2, hostile=1)
    report = attack_run(tmp_path / "run", keys, [Team("flood", ("flood",), 1)], rounds=2, deadline=20.0)
    ledger = report.ledger
    assert not report.crashes and all(report.checks.values()), (report.crashes, report.checks)
    flood = [o for o in ledger.outcomes if o.attack == "flood"]
    assert len(flood) == 2 * FLOOD
    assert ledger.unaccounted == 0, [o for o in ledger.outcomes if o.kind == "unaccounted" or not o.logged][:5]
    assert ledger.aggregated() == 0
    # every header offered beyond the 128 seats is refused: the bound comes from what each round was
    # offered (an honest miner that missed a round under load offers one header fewer), less the two
    # honest miners, which are newcomers here too and may lose the draw (the ledger tracks hostile pushes)
    excess = sum(max(0, r.event.offered - 128) for r in ledger.rounds.values())
    assert excess >= 2 * (FLOOD - 128)
    assert sum(o.kind == "refused" for o in flood) >= excess - 2 * len(ledger.rounds)
    reasons = [o.reason for o in flood if o.kind == "refused"]
    assert any("undecodable: UnknownVersion" in r for r in reasons)  # the junk frees its seat as it lands
    why = ("not drawn", "unseated", "undecodable", "its payload was refused this round", "BUSY")  # BUSY: upload budget
    assert all(any(w in r for w in why) for r in reasons), {r for r in reasons if not any(w in r for w in why)}
    assert all(r.event.submissions <= 128 and r.event.offered >= FLOOD for r in ledger.rounds.values())


def test_fabricated_pools_and_tiny_dense_payloads_on_the_rl_preset(tmp_path: Path) -> None:
    """An RL swarm (PULSELoCo) with a worker that publishes fabricated rollouts from fresh keys
    ground to sort first, and a miner pushing tiny payloads that declare every weight sent: no
    fabricated batch enters a pool (each one a pool looks at is refused as not sampled from the
    round's weights) and no tiny payload is aggregated; announcements of blobs nobody serves and a
    flood of pushed batches of noise from fresh keys do not keep a pool from being built, and no
    noise enters one."""
    keys = Keys.make(tmp_path / "keys", honest=2, hostile=2)
    m = rl_campaign_manifest(RL_DEADLINE, keys.validator_hex())
    warm_start(m.model.gpt, m.model.seed, m.rl)  # once here, cached for every process of the swarm
    # one key: unserved announcements in round 0, pushed noise in round 1. A push flood in round 0
    # could draw every newcomer seat before the fabricator's batch, which would then go unexamined
    teams = [
        Team("tiny", ("tiny-dense",), 1),
        Team("budget", ("rl-unserved", "rl-push-flood"), 1, rotate=True, stride=1),
    ]
    report = attack_run(
        tmp_path / "run", keys, teams, rounds=2, deadline=RL_DEADLINE, honest=2, task="rl", fabricators=1
    )
    ledger = report.ledger
    assert not report.crashes and all(report.checks.values()), (report.crashes, report.checks)
    fabricated = [o for o in ledger.outcomes if o.attack == "rl-fabricated"]
    refused = [o for o in fabricated if o.kind == "refused"]
    assert refused and not any(o.kind == "aggregated" for o in fabricated), fabricated
    assert all("not sampled from the round's weights" in o.reason for o in refused)
    assert all(o.kind == "unused" for o in fabricated if o not in refused)  # announced after the last pool
    tiny = [o for o in ledger.outcomes if o.attack == "tiny-dense"]
    assert tiny and not any(o.kind == "aggregated" for o in tiny) and ledger.unaccounted == 0
    pools = read_events(tmp_path / "run" / "events").events(PoolPublished, "validator")
    assert len(pools) == 2 and all(p.batches >= 1 for p in pools)
    unserved = [o for o in ledger.outcomes if o.attack == "rl-unserved"]
    assert unserved and all(o.kind == "refused" for o in unserved), unserved  # each play logged as sent
    pushes = [o for o in ledger.outcomes if o.attack == "rl-push-flood"]
    assert pushes and all(o.kind == "refused" for o in pushes), pushes  # each play logged as sent
    names = read_events(tmp_path / "run" / "events").keys()
    assert all(set(p.workers) <= {names["worker0"], names["worker1"]} for p in pools)  # no pushed noise in one
    closed = read_events(tmp_path / "run" / "events").events(RoundClosed, "validator")
    assert [c.round for c in closed] == [0, 1]
