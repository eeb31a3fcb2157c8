"""An active validator among several (the chain rule, `node/net/peer.py`): the checks around a round
that keep it from publishing over another validator's counted result (`validator_service.py`).

    check_counted(peer, validator)              # before opening r: r-1's counted result is ours
    await_standbys(peer, setup, me, r, poll)    # before opening r: the standbys audited r-1
    check_unclaimed(peer, me, r, base)          # before publishing r: nobody else published r

Each check that finds another validator's result raises `Superseded`: the service stops, and (as a
`ValidatorRole`, `standby.py`) continues as a standby.
"""

from __future__ import annotations

import asyncio
import time

from node.net.peer import Peer
from node.run.setup import RunSetup
from protocol.errors import Superseded
from protocol.messages import RoundResult
from protocol.signing import SignedMessage
from validator.core import Validator


async def check_counted(peer: Peer, v: Validator) -> None:
    """Before opening round r: the result that counts for round r-1 is this validator's, or nobody's
    yet (`Superseded` otherwise: a higher-priority validator's late result, or a standby's takeover)."""
    if v.round == 0 or v.last_result is None or len(v.book.states) < 2:
        return
    mine = SignedMessage.from_bytes(v.last_result)
    counted = await peer.counted_result(v.round - 1, v.book.states[-2])
    if counted is not None and counted.statement_id != mine.statement_id:
        raise Superseded(v.round - 1, counted.sender_hex)


async def await_standbys(peer: Peer, setup: RunSetup, me: str, r: int, poll: float) -> None:
    """Before opening round r: give the standbys that stood by in round r-1 up to `takeover_seconds`
    to audit it (their heartbeat for round r). Until one has fetched them, round r-1's evidence is
    held here alone, and a standby that cannot audit round r-1 cannot take round r over."""
    if r == 0 or len(setup.manifest.validators) < 2:
        return
    waiting = {v.sender_hex for v in await peer.validator_heartbeats(r - 1)} - {me}
    end = time.monotonic() + setup.manifest.round.takeover_seconds
    while waiting and time.monotonic() < end:
        waiting -= {v.sender_hex for v in await peer.validator_heartbeats(r)}
        if waiting:
            await asyncio.sleep(poll)


async def check_unclaimed(peer: Peer, me: str, round_: int, base: str) -> None:
    """Before publishing round r: no other validator published one already (a standby took the round
    over while this one was slow): publishing too would make nodes that applied it switch back."""
    for other in await peer.from_validators(RoundResult, round_):
        if other.sender_hex != me and other.message.base_state_hash == base:
            raise Superseded(round_, other.sender_hex)
