"""An RL run's rollout workers on the in-memory network, for the pool's tests."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from node.events import Events
from node.learn.rl.checks import announce
from node.learn.rl.config import RLConfig
from node.learn.rl.task import answer, problems_for, reward
from node.net.memory import MemoryNetwork, MemoryPeer
from node.net.peer import RunRecords
from node.net.streams import DEFAULT_LIMITS, TransferLimits
from node.net.transfer import Intake
from node.roles.rl.intake import RolloutIntake
from node.roles.rl.pool import PoolKeeper
from protocol import rollouts
from protocol.identity import Identity
from protocol.messages import RolloutAnnouncement
from protocol.rollouts import RolloutBatch, RolloutGroup

RUN = hashlib.sha256(b"rl-run").hexdigest()
VALIDATOR = Identity.from_seed(hashlib.sha256(b"pulse-test-pool-validator").digest())


CFG = RLConfig(group_size=4, prompts_per_batch=3, max_staleness=1, pool_wait_seconds=0.2)
STATES = {2: hashlib.sha256(b"w2").hexdigest(), 3: hashlib.sha256(b"w3").hexdigest()}


def honest_batch(worker: Identity, round_: int = 3, states: dict[int, str] = STATES) -> RolloutBatch:
    groups = []
    for prompt in problems_for(RUN, round_, worker.public_hex, CFG.prompts_per_batch, CFG):
        completions = (answer(prompt), b"0\n", b"x", answer(prompt))
        groups.append(RolloutGroup(prompt, completions, tuple(reward(prompt, c) for c in completions)))
    return RolloutBatch(RUN, round_, worker.public_hex, states[round_], tuple(groups))


def announced(batch: RolloutBatch) -> RolloutAnnouncement:
    return announce(batch, rollouts.encode(batch))


def lie_about_reward(batch: RolloutBatch) -> RolloutBatch:
    first = batch.groups[0]
    inflated = replace(first, rewards=tuple(1.0 for _ in first.rewards))
    return replace(batch, groups=(inflated, *batch.groups[1:]))


class Workers:
    """The validator's peer and the workers' peers on one in-memory network (records signature-checked)."""

    def __init__(self, root: Path, limits: TransferLimits = DEFAULT_LIMITS, intake: Intake | None = None) -> None:
        """`intake`: the validator's for submissions (None: it takes none)."""
        self.root = root
        self.network = MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5), limits)
        self.validator = self.network.join(VALIDATOR, root / "validator", role="validator", intake=intake)
        self.peers: dict[str, MemoryPeer] = {}

    def peer(self, worker: Identity) -> MemoryPeer:
        peer = self.peers.get(worker.public_hex)
        if peer is None:
            peer = self.peers[worker.public_hex] = self.network.join(
                worker, self.root / worker.public_hex[:8], role="follower"
            )
        return peer

    async def push(self, worker: Identity, batch: RolloutBatch, data: bytes | None = None) -> None:
        """What a worker does first: push the batch with its signed announcement to the validator
        (`TransferError` if refused); nothing is announced in the DHT."""
        peer = self.peer(worker)
        data = rollouts.encode(batch) if data is None else data
        sha = peer.store.put(data)
        await peer.submit(peer.sign(announce(batch, data)), peer.store.path(sha), to=self.validator.peer_id)

    async def publish(self, worker: Identity, batch: RolloutBatch, data: bytes | None = None) -> None:
        """What a worker does: hold the bytes, list them in a heartbeat, announce them (signed)."""
        peer = self.peer(worker)
        # a worker made this batch from W_r, so its node read the validator's result of round r-1:
        # the storages learn where the run is from such reads (records of far rounds are refused)
        self.network.budget.learn_head(max(batch.round - 1, 0))
        data = rollouts.encode(batch) if data is None else data
        peer.hold(peer.store.put(data), batch.round, "other")
        await peer.heartbeat(batch.round, batch.state_hash)
        await peer.publish(announce(batch, data))


def pushed_keeper(net: Workers, cfg: RLConfig = CFG, opened: int = 3, **kw: Any) -> PoolKeeper:
    """The validator's pool keeper with its intake of pushed batches, open at round `opened`."""
    keeper = PoolKeeper(net.validator, cfg, RUN, Events("validator"), **kw)
    keeper.intake = RolloutIntake(net.root / "rollout-inbox", cfg, VALIDATOR, RUN, keeper.trusted, keeper.penalized)
    keeper.intake.open(opened)
    net.validator.take_rollouts(keeper.intake)
    return keeper
