"""What the validator does differently in an RL run (`task = "rl"`), as one object the service calls.

- scoring: the Gauntlet's evaluator is `GRPOEvaluator` (loss = 1 - GRPO objective, so the relative
  gain of an update is the objective's improvement) and its batches are rollout batches of the
  round's pool, drawn by seed exactly as miners draw theirs (`PoolSource`);
- before a round opens: build, sign and publish the round's rollout pool (`pool.py`);
- after it closes: the policy's reward on the fixed held-out prompts (greedy), every `reward_every` rounds.
"""

from __future__ import annotations

from collections.abc import Mapping

from node.events import Events
from node.learn.model import CausalLM
from node.learn.rl.evaluator import GRPOEvaluator, PoolSource, held_out_reward
from node.learn.rl.task import held_out_prompts
from node.learn.train import load_bf16_state
from node.net.peer import Peer
from node.roles.rl.pool import PoolKeeper
from node.run.setup import RunSetup
from protocol.state import State


class RLValidation:
    def __init__(self, setup: RunSetup, events: Events, probe: CausalLM) -> None:
        self.setup, self.events = setup, events
        self.cfg = setup.manifest.rl
        gpt = setup.manifest.model.gpt  # the Gauntlet's batch function:
        self.batches = PoolSource(gpt.block_size, groups_per_seed=self.cfg.groups_per_batch)
        self.prompts = held_out_prompts(self.cfg)
        self.probe = probe  # the service's model for held-out measurements
        self.keeper: PoolKeeper | None = None

    def evaluator(self) -> GRPOEvaluator:
        reference = self.setup.initial_master() if self.cfg.kl_coef > 0 else None  # W_0, for the KL term
        return GRPOEvaluator(self.setup.new_model(), self.cfg, reference)

    async def open_round(self, peer: Peer, round_: int, states: Mapping[int, str]) -> None:
        """Build and publish the pool miners train on in `round_`; the scoring batches come from it."""
        if self.keeper is None:
            self.keeper = PoolKeeper(peer, self.cfg, self.setup.run_id, self.events)
        pool, groups = await self.keeper.build(round_, states)
        self.batches.set(groups)
        await peer.publish(pool)
        rounds = sorted({e.round for e in pool.entries})
        self.events.emit(
            "pool",
            f"round {round_}: rollout pool of {len(pool.entries)} batches (from rounds {rounds}), "
            f"{len(pool.rejections)} refused",
            round=round_,
            batches=len(pool.entries),
            workers=[e.worker for e in pool.entries],
            refused={r.worker: r.reason for r in pool.rejections},
            staleness=[round_ - e.round for e in pool.entries],
        )

    def reward_due(self, closed_round: int) -> bool:
        return (closed_round + 1) % self.cfg.reward_every == 0

    def held_out_reward(self, weights: State) -> float:
        load_bf16_state(self.probe, weights)
        return held_out_reward(self.probe, self.prompts, self.cfg)
