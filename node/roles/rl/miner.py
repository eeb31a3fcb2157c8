"""The miner of an RL run: GRPO on its share of the round's rollout pool, then the run's codec.

In round r the miner reads the validator's signed `RolloutPool` for r, fetches its batches from
any holder (hash- and size-checked, decoded with hard bounds; a few kilobytes each), draws its
groups with its assignment seeds (`PoolSource`, the rule the validator scores it by), and trains H
GRPO steps from W_r on them. The validator has already checked every batch in the pool (rewards, prompts,
state hash), so the miner only decodes.
"""

from __future__ import annotations

import logging

from node.learn.rl.evaluator import PoolSource
from node.learn.rl.grpo import GRPOTrainer
from node.net.peer import Peer
from node.roles.rl.pool import LIMITS
from node.run.setup import RunSetup
from node.run.trainer import State, Trainer
from protocol import rollouts
from protocol.errors import ProtocolError, TransferError
from protocol.identity import Identity
from protocol.messages import RolloutPool
from protocol.rollouts import RolloutGroup

log = logging.getLogger(__name__)


class RLTrainer(Trainer):
    def __init__(self, setup: RunSetup, identity: Identity, device: str = "cpu") -> None:
        super().__init__(setup, identity, device)
        m = setup.manifest
        # the KL term's reference policy is W_0, the warm start (cached on disk, so cheap after once)
        reference = setup.initial_master() if m.rl.kl_coef > 0 else None
        self.grpo = GRPOTrainer(self.model, m.train.inner, m.rl, reference=reference)
        self.rollouts: dict[int, list[RolloutGroup]] = {}  # round -> the groups this miner trains on

    async def fetch_rollouts(self, peer: Peer, round_: int) -> bool:
        """Fetch this miner's share of round `round_`'s pool; False while the pool is not readable."""
        if round_ in self.rollouts:
            return True
        pool = await peer.from_validator(RolloutPool, round_)
        if pool is None:
            return False
        batches: list[tuple[RolloutGroup, ...]] = []
        for entry in pool.entries:
            try:
                path = await peer.fetch(entry.blob_sha256, entry.blob_size, entry.round)
                batches.append(rollouts.decode(path.read_bytes(), LIMITS).groups)
            except (TransferError, ProtocolError) as exc:
                log.info("round %d: rollout batch %s not usable yet: %s", round_, entry.blob_sha256[:12], exc)
                return False
        source = PoolSource(groups_per_seed=self.setup.manifest.rl.groups_per_batch)
        source.set(batches)
        self.rollouts = {round_: source.groups(self.assignment(round_).seeds)}
        return True

    def train(self, round_: int, weights: State) -> State:
        """FP32 pseudo-gradient W - W_local after H GRPO steps from `weights` on this round's rollouts."""
        groups = self.rollouts.get(round_)
        if not groups:
            raise RuntimeError(f"no rollouts fetched for round {round_}")
        delta = self.grpo.train(weights, groups, self.setup.manifest.train.inner_steps)
        self.steps_done += self.setup.manifest.train.inner_steps
        self.last_loss = self.grpo.last_loss
        return delta
