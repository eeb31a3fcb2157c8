"""An inference worker that lies, in its own process, for the RL swarm test.

    python -m tests.swarm.lying_worker --lie reward|state --config RUN.toml --events F.jsonl --state-dir D \
        --rounds R --initial-peers MADDR --host /ip4/127.0.0.1/tcp/0

It follows the run like any worker (checkpoint, patches, hash checks) but publishes rollout
batches that claim reward 1.0 for every completion (`reward`), or that name a state hash it did
not generate them from (`state`). The validator must refuse them with the reason and leave the
worker out of its pools.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field

from node.commands.options import script_options
from node.events import Events
from node.net.netconfig import NetOptions
from node.net.p2ppeer import P2PPeer
from node.roles.catchup import Held
from node.roles.follower import Follower
from node.roles.records import run_records
from node.roles.rl.worker import RolloutWorker
from node.run.manifest import load_manifest
from node.run.setup import RunSetup
from protocol.identity import Identity
from protocol.rollouts import RolloutBatch


class LyingWorker(RolloutWorker):
    lie = "reward"

    def generate(self, held: Held) -> RolloutBatch:
        batch = super().generate(held)
        if self.lie == "reward":
            return replace(batch, groups=tuple(replace(g, rewards=(1.0,) * len(g.rewards)) for g in batch.groups))
        return batch

    async def serve(self, held: Held) -> None:
        if self.lie == "state":  # claims rollouts of another state: announce and tag a made-up hash
            fake = hashlib.sha256(held.state_hash.encode()).hexdigest()
            held = Held(held.round, held.weights, fake)
        await super().serve(held)


async def main(args: LyingOptions) -> None:
    setup = RunSetup.from_manifest(load_manifest(args.config))
    identity = Identity.generate()
    events = Events("follow", args.events)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.state_dir or Path(tmp)
        peer = await P2PPeer.create(args.net_config(), run_records(setup.manifest), identity, folder, role="follower")
        worker = LyingWorker(setup, identity, peer, events)
        worker.lie = args.lie
        follower = Follower(peer, events, [worker])
        try:
            await follower.run(args.rounds)
        finally:
            await follower.shutdown()
            events.finish()


class LyingOptions(NetOptions):
    """The lying inference worker's options."""

    lie: Literal["reward", "state"]
    """what it lies about"""
    config: Path
    """run manifest TOML"""
    events: Path
    """JSON lines of what it did"""
    state_dir: Path | None = None
    """folder for blobs (default: a temporary one)"""
    rounds: int = Field(ge=0)
    """stop after this round"""


if __name__ == "__main__":
    asyncio.run(main(script_options(LyingOptions, None, "python -m tests.swarm.lying_worker")))
