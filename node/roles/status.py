"""What `pulse status` shows, read from the run's records: the round, who is active, the latest scores.

status = await read_status(view)    # view: any `RunView` (a `P2PPeer`, a `DHTView`, a `MemoryPeer`)

The round comes from the validator's head (`RunView.position`), so it is right at any round; when
nothing of the run is found at all, `found` is False (`pulse status` says so and fails).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from node.net.peer import RunView
from protocol.messages import Heartbeat, RoundResult, RunHead, SubmissionHeader


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
    head: RunHead | None = None  # the validator's head, if one was found

    @property
    def open_round(self) -> int:
        return self.last_round + 1

    @property
    def found(self) -> bool:
        """Whether anything of the run was seen: a head, a round result or a heartbeat."""
        return self.head is not None or self.result is not None or bool(self.active)


async def read_status(view: RunView) -> RunStatus:
    current, _, head = await view.position()
    last = current - 1
    result = await view.round_result(last) if last >= 0 else None
    rounds = (current, last) if last >= 0 else (0,)
    beats = [v for r in rounds for v in await view.get(Heartbeat, r)]
    active: dict[str, ActiveNode] = {}
    now = int(time.time())
    for v in beats:
        b = v.message
        if v.sender_hex not in active:  # the open round's heartbeat first
            active[v.sender_hex] = ActiveNode(b.role, v.sender_hex, b.round, b.state_hash, max(0, now - b.sent_at))
    headers = len(await view.get(SubmissionHeader, current))
    return RunStatus(view.run_id, last, result, list(active.values()), headers, head)
