"""What the validator does around each round of an RL run (`task = "rl"`): `RLRoundHooks`.

- from the start: take the rollout batches workers push (`intake.py`, a folder beside the blobs);
- before a round opens: build, check, sign and publish the round's rollout pool (`pool.py`), and
  hand its groups to the task's `PoolSource`, the Gauntlet's batch function: the validator scores
  on pool samples drawn by seed exactly as miners draw theirs. The pool's checks include whether
  each batch was sampled from the weights of its round (`provenance.py`): the hooks keep the
  validator's weights of the rounds a pool may draw on;
- after it closes: the policy's reward on the fixed held-out prompts (greedy), every `reward_every` rounds.
"""

from __future__ import annotations

from collections.abc import Mapping

from node.events import Events
from node.events.models import PoolPublished
from node.learn.model import CausalLM
from node.learn.rl.evaluator import held_out_reward
from node.learn.rl.provenance import SamplingCheck
from node.learn.train import load_bf16_state
from node.net.peer import Peer
from node.roles.hooks import HeldOut
from node.roles.rl.intake import RolloutIntake
from node.roles.rl.pool import PoolKeeper
from node.run.task import RLTask
from protocol.state import State


class RLRoundHooks:
    def __init__(self, task: RLTask, peer: Peer, events: Events, probe: CausalLM, *, poll: float = 0.5) -> None:
        self.task, self.peer, self.events, self.cfg = task, peer, events, task.cfg
        self.prompts = task.held_out_prompts()
        self.probe = probe  # the model held-out rewards are measured with, and rollouts checked
        self.sampling = SamplingCheck(probe, self.cfg)
        self.keeper = PoolKeeper(peer, self.cfg, task.setup.run_id, events, poll=poll, sampling=self.sampling)
        inbox = peer.store.root.parent / "rollout-inbox"
        keeper = self.keeper
        keeper.intake = RolloutIntake(
            inbox, self.cfg, peer.identity, task.setup.run_id, keeper.trusted, keeper.penalized
        )
        peer.take_rollouts(self.keeper.intake)

    async def before_open(self, round_: int, state_hash: str, states: Mapping[int, str], weights: State) -> None:
        """Build and publish the pool miners train on in `round_`; the scoring batches come from it."""
        self.sampling.remember(round_, weights)
        # a heartbeat first, so that workers find the checkpoint and patch holders while the pool is
        # built; miners wait for the pool, and the service's heartbeat at opening restarts the deadline clock
        await self.peer.heartbeat(round_, state_hash)
        pool, groups = await self.keeper.build(round_, states)
        self.task.pool.set(groups)
        await self.peer.publish(pool)
        rounds = sorted({e.round for e in pool.entries})
        self.events.emit(
            PoolPublished(
                round=round_,
                batches=len(pool.entries),
                workers=[e.worker for e in pool.entries],
                refused={r.worker: r.reason for r in pool.rejections},
                staleness=[round_ - e.round for e in pool.entries],
            ),
            f"round {round_}: rollout pool of {len(pool.entries)} batches (from rounds {rounds}), "
            f"{len(pool.rejections)} refused",
        )

    def baseline(self, weights: State) -> HeldOut:
        return HeldOut(reward=self._reward(weights))

    def after_close(self, round_: int, weights: State) -> HeldOut:
        due = (round_ + 1) % self.cfg.reward_every == 0
        return HeldOut(reward=self._reward(weights)) if due else HeldOut()

    def _reward(self, weights: State) -> float:
        self.sampling.forget_loaded()
        load_bf16_state(self.probe, weights)
        return held_out_reward(self.probe, self.prompts, self.cfg)
