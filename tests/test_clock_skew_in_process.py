"""Clock skew in the in-process tier: the validator's wall clock is a parameter of its service.

The validator runs 5 s behind its miners (its heartbeats' signed `sent_at`, its arrivals and its
deadline all read its own clock). Miners budget each round from that `sent_at` against their own
clock, so they see less time left than the validator gives them: every round still takes both
miners' submissions and closes.
"""

from __future__ import annotations

import asyncio
import time

from node.events.models import RoundClosed
from protocol.messages import Heartbeat
from tests.rounds import TIMEOUT, MakeHarness, key, lm_manifest

SKEW = -5.0  # seconds the validator's clock is behind the miners'


def test_a_validator_clock_behind_its_miners_still_closes_full_rounds(round_harness: MakeHarness) -> None:
    h = round_harness("skewed", lm_manifest())
    h.rounds = 2
    sent_at: list[int] = []

    async def play() -> None:
        try:
            h.start_validator(clock=lambda: time.time() + SKEW)
            miners = [h.start_miner("miner0"), h.start_miner("miner1")]
            await asyncio.wait_for(asyncio.gather(*miners), TIMEOUT)
            validator = key("validator").public_hex
            sent_at.extend(b.message.sent_at for b in h.network.get(Heartbeat, 1) if b.sender_hex == validator)
        finally:
            await h.stop()

    asyncio.run(play())
    closed = h.log().events(RoundClosed, "validator")
    assert [c.round for c in closed] == [0, 1]
    assert all(c.submissions == 2 for c in closed), [c.submissions for c in closed]
    # the open heartbeat of round 1 was signed on the validator's clock, not the process's
    assert sent_at and max(sent_at) <= time.time() + SKEW + 1
