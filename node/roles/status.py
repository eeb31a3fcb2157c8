"""What `pulse status` shows, read from the run's records: the round, who is active, the latest scores.

status = await read_status(view)    # view: any `RunView` (a `P2PPeer`, a `DHTView`, a `MemoryPeer`)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from node.net.peer import RunView
from protocol.messages import Heartbeat, RoundResult, SubmissionHeader


@dataclass(frozen=True)
class ActiveNode:
    role: str
    key: str  # public key, hex
    round: int  # the round of its latest heartbeat
    state_hash: str | None
    seconds_ago: int


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    last_round: int  # the last round with a published result; -1 if none
    result: RoundResult | None  # that round's result
    active: list[ActiveNode]  # nodes with a heartbeat in the open round or the last closed one
    headers: int  # submission headers for the open round in the DHT so far

    @property
    def open_round(self) -> int:
        return self.last_round + 1


async def read_status(view: RunView) -> RunStatus:
    last, result = await view.latest_result()
    current = last + 1
    rounds = (current, last) if last >= 0 else (0,)
    beats = [v for r in rounds for v in await view.get(Heartbeat, r)]
    active: dict[str, ActiveNode] = {}
    now = int(time.time())
    for v in beats:
        b = v.message
        if v.sender_hex not in active:  # the open round's heartbeat first
            active[v.sender_hex] = ActiveNode(b.role, v.sender_hex, b.round, b.state_hash, max(0, now - b.sent_at))
    headers = len(await view.get(SubmissionHeader, current))
    return RunStatus(view.run_id, last, result, list(active.values()), headers)
