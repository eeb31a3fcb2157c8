"""Adaptive round deadlines: the target learned from arrivals (median + k MAD, within the manifest's
bounds), when a round closes, and a run where one miner's uplink is slow: rounds stop waiting for it
and it sends a smaller payload instead (in process, on the in-memory network's rate-limited links)."""

from __future__ import annotations

import asyncio

import pytest

from node.events import EventLog
from node.events.models import RoundClosed, RoundOpened, Submitted
from node.roles.deadline import MIN_MARGIN, RoundClock
from node.roles.uplink import MIN_FRACTION, Uplink
from node.run.manifest import RoundSection
from tests.rounds import (
    TIMEOUT,
    Harness,
    MakeHarness,
    adaptive_manifest,
)


def clock(**fields: object) -> RoundClock:
    return RoundClock(RoundSection.model_validate({"deadline_seconds": 60.0, "deadline_mode": "adaptive", **fields}))


def test_the_target_is_the_deadline_until_arrivals_are_known() -> None:
    assert clock().target() == 60.0
    fixed = RoundClock(RoundSection(deadline_seconds=60.0))
    fixed.record([1.0, 2.0])
    assert fixed.target() == 60.0  # fixed mode never learns


def test_the_target_is_median_plus_k_mads_of_the_quorums_arrivals_within_the_bounds() -> None:
    c = clock(margin_mads=3.0, min_seconds=2.0, quorum=0.75)
    c.record([4.0, 5.0, 6.0, 30.0])  # the quorum (3 of 4): median 5.0, MAD 1.0
    assert c.target() == pytest.approx(8.0)
    of_more = clock(margin_mads=3.0, quorum=0.75)
    of_more.record([4.0, 5.0, 6.0, 30.0], active=8)  # 8 active, a quorum of 6: all four arrivals count
    assert of_more.target() == pytest.approx(5.5 + 3.0 * 1.0)
    instant = clock(min_seconds=2.0)
    instant.record([0.1] * 40)  # instant arrivals: never below the minimum
    assert instant.target() == 2.0
    late = clock(margin_mads=3.0)
    late.record([50.0, 70.0, 90.0])
    assert late.target() == 60.0  # never past the deadline
    bad = clock()
    bad.record([float("nan"), -1.0, float("inf")])
    assert bad.target() == 60.0


def test_one_slow_round_moves_the_target_by_a_rank_not_by_its_lateness() -> None:
    c = clock(margin_mads=3.0, quorum=1.0)
    c.record([9.0, 9.2])  # a cold start
    c.record([1.0, 1.2])
    c.record([1.0, 1.2])
    assert c.target() == pytest.approx(1.1 + 3 * 0.1)  # pooled with the slow round's: 1.2 + 3 x 0.2


def test_one_straggler_moves_the_target_by_a_rank_not_by_its_lateness() -> None:
    c = clock(history_rounds=3)
    for _ in range(3):
        c.record([2.0, 2.1, 2.2, 2.3, 59.0])
    assert c.target() < 3.0


def test_a_quorum_arriving_at_once_still_leaves_a_margin() -> None:
    c = clock(margin_mads=3.0)
    c.record([4.0, 4.0, 4.0])  # MAD 0: the margin is the floor, a share of the median
    assert c.target() == pytest.approx(4.0 * (1 + MIN_MARGIN))


def test_a_straggler_landing_just_before_the_target_does_not_pull_it_later() -> None:
    """A slow miner that shrinks its payload to arrive just before the target, every round: the
    target stays where the quorum's arrivals put it (were its arrivals learned from, each one would
    pull the next target later and the rounds would drift back to waiting for it)."""
    c = clock(margin_mads=3.0, quorum=0.6, history_rounds=8)
    c.record([1.0, 1.2, 9.0])  # the first round waits for its whole payload
    first = c.target()
    assert first == pytest.approx(1.1 + 3 * 0.1)
    for _ in range(8):
        c.record([1.0, 1.2, c.target() - 0.01])
    assert c.target() == pytest.approx(first)


def test_when_a_round_closes() -> None:
    c = clock(min_seconds=1.0, quorum=0.75)
    c.record([2.0, 2.0, 2.0])  # target 2.5 (median 2.0, the margin floor a quarter of it)
    assert not c.should_close(0.5, received=4, active=4)  # before the minimum
    assert c.should_close(1.5, received=4, active=4)  # everyone is in
    assert not c.should_close(1.5, received=3, active=4)  # a quorum, but before the target
    assert not c.should_close(2.2, received=3, active=4)
    assert c.should_close(3.0, received=3, active=4)  # a quorum after the target
    assert not c.should_close(3.0, received=2, active=4)  # no quorum: wait...
    assert c.should_close(60.0, received=0, active=4)  # ...until the deadline
    fixed = RoundClock(RoundSection(deadline_seconds=60.0))
    assert not fixed.should_close(30.0, received=3, active=4)


def test_announced_newcomers_are_waited_for_only_until_the_others_quorum_and_the_target() -> None:
    """A newcomer's announcement costs nothing: a flood of them may stop the early close, not hold
    the round to its deadline, nor move the quorum the others make."""
    c = clock(min_seconds=1.0, quorum=0.75)
    c.record([2.0, 2.0, 2.0])  # target 2.5
    assert not c.should_close(1.5, received=4, active=4, newcomers=8)  # everyone in? not the newcomers
    assert c.should_close(2.6, received=4, active=4, newcomers=8)  # the quorum of the 4, past the target
    assert c.should_close(2.6, received=3, active=4, newcomers=8)
    assert not c.should_close(2.6, received=2, active=4, newcomers=8)
    assert c.should_close(1.5, received=5, active=4, newcomers=1)  # the newcomer came too: everyone is in
    fixed = RoundClock(RoundSection(deadline_seconds=60.0, min_seconds=1.0))
    assert not fixed.should_close(30.0, received=4, active=4, newcomers=8)  # the round knew nobody: wait
    assert not fixed.should_close(7.9, received=4, active=4, newcomers=8, known_in=4.0)
    assert fixed.should_close(8.0, received=4, active=4, newcomers=8, known_in=4.0)  # as long again, no more
    assert not fixed.should_close(9.0, received=3, active=4, newcomers=8, known_in=4.0)  # a known miner is out


def test_the_uplink_sizes_the_payload_to_the_time_left() -> None:
    uplink = Uplink()
    assert uplink.fraction(1.0) == 1.0  # nothing measured yet: the whole payload
    uplink.measured(1_000_000, 10.0, 1.0)  # 100 kB/s, payloads of 1 MB
    assert uplink.fraction(100.0) == 1.0
    assert uplink.fraction(5.0) == pytest.approx(0.25)  # 5 s x 100 kB/s x 0.5 safety
    assert uplink.fraction(0.0) == MIN_FRACTION
    uplink.measured(250_000, 2.5, 0.25)  # a quarter payload at the same rate: the full size stays 1 MB
    assert uplink.full_bytes == pytest.approx(1_000_000)


ROUNDS = 4
SLOW_UPLINK = 4_000.0  # bytes/s: a whole payload of miner2 takes seconds


async def play(h: Harness) -> None:
    try:
        h.start_validator()
        miners = [h.start_miner("miner0"), h.start_miner("miner1"), h.start_miner("miner2", SLOW_UPLINK)]
        await asyncio.wait_for(asyncio.gather(*miners), TIMEOUT)
    finally:
        await h.stop()


@pytest.fixture(scope="module")
def adaptive_run(round_harness: MakeHarness) -> EventLog:
    h = round_harness("adaptive", adaptive_manifest())
    h.rounds = ROUNDS
    asyncio.run(play(h))
    return h.log()


def test_rounds_stop_waiting_for_a_slow_uplink(adaptive_run: EventLog) -> None:
    log = adaptive_run
    closed = log.events(RoundClosed, "validator")
    opened = log.events(RoundOpened, "validator")
    assert [c.round for c in closed] == list(range(ROUNDS))
    assert opened[0].target_seconds == 30.0  # nothing learned yet: the deadline
    slow_key = log.keys()["miner2"]
    first = closed[0]
    assert slow_key in first.arrivals and first.open_seconds is not None
    assert first.open_seconds >= first.arrivals[slow_key]  # the first round waited for everyone
    later = closed[1:]
    assert all(o.target_seconds is not None and o.target_seconds < 10.0 for o in opened[1:])
    assert all(c.open_seconds is not None and c.open_seconds < first.arrivals[slow_key] for c in later)
    slow_sent = log.events(Submitted, "miner2")
    assert slow_sent[0].fraction == 1.0
    assert any(s.fraction < 0.5 for s in slow_sent[1:]), [s.fraction for s in slow_sent]
    assert all(s.fraction == 1.0 for name in ("miner0", "miner1") for s in log.events(Submitted, name))


def test_a_shrunk_payload_is_decoded_by_the_runs_rules(adaptive_run: EventLog) -> None:
    """A shrunk payload arrives in time and is scored (aggregated, or rejected on its merits), never
    refused as undecodable; the run must have shrunk at least one that arrived, or this proves nothing."""
    slow_key = adaptive_run.keys()["miner2"]
    rounds = {s.round for s in adaptive_run.events(Submitted, "miner2") if s.fraction < 1.0}
    closed = {c.round: c for c in adaptive_run.events(RoundClosed, "validator")}
    arrived = [r for r in sorted(rounds) if slow_key in closed[r].arrivals]
    assert arrived, f"no shrunk payload arrived in time (shrunk in rounds {sorted(rounds)})"
    for r in arrived:
        outcome = closed[r]
        assert slow_key in outcome.scores or slow_key in outcome.rejections, f"round {r}: not scored"
        assert "undecodable" not in outcome.rejections.get(slow_key, ""), outcome.rejections[slow_key]
