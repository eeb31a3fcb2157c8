"""The follower: bit-identical BF16 weights through PULSESync patches, and what it serves from them.

It joins from the newest checkpoint, then applies every round's patch, verifying each state hash
(`catchup.Chain`), and announces itself once a round (a heartbeat listing the patches and the
checkpoint it re-serves, so fetchers can spread over it, and `pulse status` lists it). With
`--audit` its weights come from an auditor instead (`auditor.py`): an FP32 replica that recomputes
every round, so it never holds a state it has not verified.

For each round it holds, it runs its round services: none in a language modelling run (an
inference worker serves its own requests), the rollout worker in an RL run (`rl/worker.py`,
generating and publishing the round's rollouts). Stopping at `rounds`, it announces the state it
ends on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from node.events import Events
from node.events.models import Final, Started
from node.net.peer import Peer
from node.roles.catchup import Chain, Held

POLL_SECONDS = 0.5


class RoundService(Protocol):
    """Work a follower does once it holds a round's weights."""

    async def serve(self, held: Held) -> None: ...


class Weights(Protocol):
    """Where a follower's weights come from: `Chain` (patches, hash-checked) or `Auditor` (recomputed)."""

    async def sync(self) -> Held: ...


class Follower:
    def __init__(
        self,
        peer: Peer,
        events: Events,
        services: Sequence[RoundService] = (),
        *,
        poll: float = POLL_SECONDS,
        weights: Weights | None = None,
    ) -> None:
        self.peer, self.events, self.services, self.poll = peer, events, list(services), poll
        self.chain: Weights = weights or Chain(peer, events, poll=2 * poll)

    async def run(self, rounds: int | None = None) -> Held:
        """Follow until holding W_rounds (None: forever)."""
        key = self.peer.identity.public_hex
        self.events.emit(
            Started(sender=key, peer_id=self.peer.peer_id), f"follower {key[:12]} joined, peer id {self.peer.peer_id}"
        )
        held = await self.chain.sync()
        announced: int | None = None
        while rounds is None or held.round < rounds:
            if announced != held.round:  # its heartbeat lists the patches it re-serves to fetchers
                await self.peer.heartbeat(held.round, held.state_hash)
                announced = held.round
            for service in self.services:
                await service.serve(held)
            await asyncio.sleep(self.poll)
            held = await self.chain.sync()
        await self.peer.heartbeat(held.round, held.state_hash)  # the validator lingers until it sees this
        self.events.emit(
            Final(round=held.round, state_hash=held.state_hash),
            f"holding the state of round {held.round}, hash {held.state_hash[:12]}",
        )
        return held

    async def shutdown(self) -> None:
        await self.peer.shutdown()
