"""A rollout worker that fabricates: `python -m pulse_redteam.campaign.fabricator --config RUN.toml ...`.

It follows an RL run like any worker (checkpoint, patches, hash checks) and, for every round it
holds, publishes a rollout batch that passes every public check (the prompts its key derives, G
completions each, truthful rewards, the state hash of the round) but whose completions were chosen,
not sampled: wrong sums, one right answer per group, the preference a poisoner would have miners
learn. Each round it signs with a fresh key ground until it sorts first (a pool taken in key order
would take it first), as a free key costs nothing and a refused one is left out for rounds.

Each announcement is logged as one `attack` event (status ANNOUNCED); the validator's pool events
say what became of it (`ledger.py`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import tempfile
from pathlib import Path

import torch
from pydantic import Field

from node.commands.options import script_options
from node.events import Events
from node.events.campaign import AttackSent
from node.learn.rl.checks import announce
from node.learn.rl.config import RLConfig
from node.learn.rl.task import answer, problems_for, reward
from node.net.dht import sign_for
from node.net.netconfig import NetOptions
from node.net.p2ppeer import P2PPeer
from node.net.peer import Peer
from node.roles.catchup import Held
from node.roles.follower import Follower
from node.roles.records import run_records
from node.roles.rl.worker import push_batch
from node.run.manifest import load_manifest
from node.run.setup import RunSetup
from protocol import rollouts
from protocol.errors import NetworkError
from protocol.identity import Identity
from protocol.rollouts import RolloutBatch, RolloutGroup

log = logging.getLogger("pulse.fabricator")
SORTS_BEFORE = "08"  # a ground key's hex starts below this: one key in 32, found in a few dozen tries


def ground_key(label: str) -> Identity:
    """The first key derived from `label` whose hex sorts before `SORTS_BEFORE` (before most honest keys)."""
    i = 0
    while True:
        key = Identity.from_seed(hashlib.sha256(f"{label}/{i}".encode()).digest())
        if key.public_hex < SORTS_BEFORE:
            return key
        i += 1


def wrong_sum(prompt: bytes, j: int) -> bytes:
    return str((int(answer(prompt)) + 37 + 11 * j) % 200).encode() + b"\n"


def fabricate(run_id: str, round_: int, worker: str, state_hash: str, cfg: RLConfig) -> RolloutBatch:
    """Every public fact right; per group one right answer and G - 1 wrong sums."""
    groups = []
    for prompt in problems_for(run_id, round_, worker, cfg.prompts_per_batch, cfg):
        chosen = tuple(answer(prompt) if j == 0 else wrong_sum(prompt, j) for j in range(cfg.group_size))
        groups.append(RolloutGroup(prompt, chosen, tuple(reward(prompt, c) for c in chosen)))
    return RolloutBatch(run_id, round_, worker, state_hash, tuple(groups))


class Fabricator:
    """The round service: one fabricated batch per round, from a fresh ground key."""

    def __init__(self, setup: RunSetup, peer: Peer, events: Events) -> None:
        self.setup, self.peer, self.events = setup, peer, events
        self.done: set[int] = set()

    async def serve(self, held: Held) -> None:
        if held.round in self.done:
            return
        self.done.add(held.round)
        me = ground_key(f"fabricator/{self.setup.run_id}/{held.round}")
        batch = fabricate(self.setup.run_id, held.round, me.public_hex, held.state_hash, self.setup.manifest.rl)
        data = rollouts.encode(batch)
        sha = self.peer.store.put(data)
        self.peer.hold(sha, held.round, "other")
        await self.peer.heartbeat(held.round, held.state_hash)  # lists the blob: the validator finds a holder
        signed = sign_for(me, announce(batch, data), self.peer.run.record_ttl_seconds)  # fresh, as workers sign
        wait = self.setup.manifest.rl.pool_wait_seconds
        pushed = await push_batch(self.peer, held.round, signed, self.peer.store.path(sha), wait)
        try:
            await self.peer.publish_signed(signed.to_bytes())
            status = "PUSHED" if pushed else "ANNOUNCED"
        except NetworkError as exc:
            log.info("round %d: announcement not stored: %s", held.round, exc)
            status = "PUSHED" if pushed else "BROKEN"
        sent = AttackSent(
            round=held.round,
            attack="rl-fabricated",
            sender=me.public_hex,
            header_round=held.round,
            message_id=signed.message_id,
            payload_sha256=sha,
            status=status,
            reason="",
            body_sent=True,
            peer_id=self.peer.peer_id,
        )
        self.events.emit(sent, f"round {held.round}: fabricated rollouts from {me.public_hex[:12]}: {status}")


async def _run(args: FabricatorOptions) -> int:
    setup = RunSetup.from_manifest(load_manifest(args.config))
    events = Events("hostile", args.events)
    identity = Identity.generate()  # the transport's and heartbeats' key; batches are signed by ground keys
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.state_dir or Path(tmp)
        config = args.net_config()
        peer = await P2PPeer.create(config, run_records(setup.manifest), identity, folder, role="follower")
        follower = Follower(peer, events, [Fabricator(setup, peer, events)])
        try:
            await follower.run(args.rounds)
        finally:
            await follower.shutdown()
            events.finish()
    return 0


class FabricatorOptions(NetOptions):
    """The fabricating follower's options (`python -m pulse_redteam.campaign.fabricator`)."""

    config: Path
    """run manifest TOML"""
    events: Path
    """JSON lines of what it did"""
    state_dir: Path | None = None
    """folder for blobs (default: a temporary one)"""
    rounds: int = Field(ge=0)
    """stop after this round"""
    threads: int = Field(default=1, ge=0)
    """torch CPU threads"""


def main(argv: list[str] | None = None) -> int:
    options = script_options(FabricatorOptions, argv, "python -m pulse_redteam.campaign.fabricator", __doc__)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(options.threads)
    return asyncio.run(_run(options))


if __name__ == "__main__":
    sys.exit(main())
