"""The policy as the validator's `Evaluator`, the round's rollout pool as its batch source, held-out reward.

The Gauntlet scores an update g by the relative gain (L(B, W) - L(B, W - eta*g)) / L(B, W). For
RL the loss of a batch B of rollout groups is

    L(B, W') = 1 - J(B, W'),   J = the clipped GRPO objective with logp_old taken at the base W

(minus the KL penalty inside J when the run has one). At the base the ratio is 1 everywhere and
J = mean of the advantages = 0 (they are zero-mean within each group), so L(B, W) = 1 and the
relative gain is exactly J(B, W - eta*g): how much the update improves the GRPO objective on B.

Call order (validator/scoring.py `RoundEvaluation`): `load(W)`, losses of every batch, then
`load(W, update, step)` and losses, once per update. logp_old of a batch is computed at the base
the first time the batch is seen after `load(W)` and cached for that base; a plain `load` (or a
load on another base object) clears the cache, so a new round never uses the old base's values.
A batch first seen while an update is loaded gets its logp_old from the base all the same (the
base is reloaded for it). The base mapping must not be changed in place while it is loaded.
"""

from __future__ import annotations

import copy
import hashlib
import struct
from collections.abc import Callable, Sequence

import torch

from node.learn.model import CausalLM
from node.learn.rl.config import RLConfig
from node.learn.rl.generate import greedy
from node.learn.rl.grpo import RolloutTensors, kl_k3, rollout_tensors, surrogate, token_logps
from node.learn.rl.task import reward
from node.learn.train import load_state, unique_state
from protocol.rollouts import RolloutGroup
from protocol.state import State


class GRPOEvaluator:
    """Loads base - step * update into the policy and measures 1 - J on rollout batches."""

    def __init__(self, model: CausalLM, cfg: RLConfig, reference: State | None = None) -> None:
        self.model, self.cfg = model.eval(), cfg
        self._params = unique_state(model)
        self._device = next(model.parameters()).device
        self._base: State | None = None
        self._update: State | None = None
        self._step = 0.0
        # id(batch) -> (batch, batch on the device, logp_old at the base, reference logp or None); the
        # batch is held so that its id cannot be reused by another object while the entry lives
        self._cache: dict[int, tuple[RolloutTensors, RolloutTensors, torch.Tensor, torch.Tensor | None]] = {}
        self._reference: CausalLM | None = None
        if reference is not None and cfg.kl_coef > 0:
            self._reference = copy.deepcopy(model).requires_grad_(False)
            load_state(self._reference, reference)

    def load(self, base: State, update: State | None = None, step: float = 0.0) -> None:
        if update is None or base is not self._base:
            self._cache.clear()  # a (possibly) new base: logp_old must be recomputed
        self._base, self._update, self._step = base, update, step
        self._write(base, update, step)

    def loss(self, batch: RolloutTensors) -> float:
        """1 - J(batch) at the loaded weights, J with logp_old at the base (see the module docstring)."""
        if self._base is None:
            raise RuntimeError("load weights before measuring a loss")
        entry = self._cache.get(id(batch))
        if entry is None or entry[0] is not batch:
            moved = batch.to(self._device)
            entry = self._cache[id(batch)] = (batch, moved, *self._at_base(moved))
        _, b, old, ref = entry
        with torch.no_grad():
            logp = token_logps(self.model, b.tokens)
            j = surrogate(logp, old, b.advantages, b.mask, self.cfg.clip_eps)
            if ref is not None:
                j = j - self.cfg.kl_coef * kl_k3(logp, ref, b.mask)
        return 1.0 - float(j)

    def _at_base(self, batch: RolloutTensors) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logp_old at the base (reloading it when an update is loaded) and the reference's logp."""
        assert self._base is not None
        perturbed = self._update is not None and self._step != 0.0
        if perturbed:
            self._write(self._base, None, 0.0)
        with torch.no_grad():
            old = token_logps(self.model, batch.tokens)
            ref = token_logps(self._reference, batch.tokens) if self._reference is not None else None
        if perturbed:
            self._write(self._base, self._update, self._step)
        return old, ref

    def _write(self, base: State, update: State | None, step: float) -> None:
        with torch.no_grad():
            for name, param in self._params.items():
                param.copy_(base[name])
                if update is not None and step != 0.0:
                    param.sub_(update[name].to(param.device), alpha=step)


def pool_sample(seed: int, sizes: Sequence[int], k: int) -> list[tuple[int, int]]:
    """The `k` (pool batch, group index) pairs seed names in a pool whose batches hold `sizes` groups.

    Only the sizes matter, so a miner can tell from the signed pool alone which batches to fetch.
    """
    prefix = b"pulse/rl-pool-sample/v1\x00" + struct.pack(">Q", seed)
    ranked = sorted(
        (hashlib.sha256(prefix + struct.pack(">II", b, g)).digest(), b, g)
        for b, n in enumerate(sizes)
        for g in range(n)
    )
    return [(b, g) for _, b, g in ranked[:k]]


class PoolSource:
    """The round's rollout pool as the validator's batch function, and what each miner trains on.

    Seed s names a sample of `groups_per_seed` groups (default: the size of the first pool batch,
    i.e. one worker batch) drawn without replacement from all the pool's groups: the groups ranked
    by SHA-256(s, pool batch, group index), first ones taken. Miners' assignment seeds thus name
    their training groups (`groups`) and the validator's secret seeds random samples, and two
    miners share only a pool-sized fraction of their groups: a miner that drew the same pool batch
    as another still trains on different rollouts, so honest updates are not near copies. (With
    whole pool batches per seed, two miners drawing the same batch from the same weights send the
    same update, and the Gauntlet's copy check penalizes one of them.)

    Tensors are built once per seed and round, so the same seed gives the same object (the
    evaluator's cache relies on it). Every node must order the pool the same way (the validator's
    published pool order) and `set` it each round.
    """

    def __init__(self, block_size: int | None = None, *, groups_per_seed: int | None = None) -> None:
        if groups_per_seed is not None and groups_per_seed < 1:
            raise ValueError("groups_per_seed must be >= 1")
        self.block_size, self.groups_per_seed = block_size, groups_per_seed
        self._pool: list[Sequence[RolloutGroup]] = []
        self._tensors: dict[int, RolloutTensors] = {}

    def set(self, groups_by_batch: Sequence[Sequence[RolloutGroup]]) -> None:
        if not groups_by_batch or any(not groups for groups in groups_by_batch):
            raise ValueError("a rollout pool needs at least one batch, each with at least one group")
        self._pool, self._tensors = list(groups_by_batch), {}

    def __len__(self) -> int:
        return len(self._pool)

    def sample(self, seed: int) -> list[tuple[int, int]]:
        """(pool batch, group index) pairs that `seed` names, in rank order."""
        if not self._pool:
            raise RuntimeError("the rollout pool is empty: set it before drawing batches")
        return pool_sample(seed, [len(g) for g in self._pool], self.groups_per_seed or len(self._pool[0]))

    def batches_for(self, seeds: Sequence[int]) -> list[int]:
        """Pool batches holding the groups `seeds` name: what a miner has to fetch."""
        return sorted({b for s in seeds for b, _ in self.sample(s)})

    def groups(self, seeds: Sequence[int]) -> list[RolloutGroup]:
        """What a miner trains on: the groups its seeds name, in seed then rank order, each group once."""
        picked = dict.fromkeys(pair for s in seeds for pair in self.sample(s))
        return [self._pool[b][g] for b, g in picked]

    def __call__(self, seed: int) -> RolloutTensors:
        if seed not in self._tensors:
            self._tensors[seed] = rollout_tensors(self.groups([seed]), self.block_size)
        return self._tensors[seed]


def pool_batch_fn(
    groups_by_batch: Sequence[Sequence[RolloutGroup]], block_size: int | None = None, groups_per_seed: int | None = None
) -> Callable[[int], RolloutTensors]:
    """seed -> tensors of the pool sample that seed names; see `PoolSource`."""
    source = PoolSource(block_size, groups_per_seed=groups_per_seed)
    source.set(groups_by_batch)
    return source


def held_out_reward(model: CausalLM, prompts: Sequence[bytes], cfg: RLConfig) -> float:
    """Mean reward of the policy's greedy completions of `prompts`."""
    completions = greedy(model, prompts, cfg.max_new_tokens)
    return sum(reward(p, c) for p, c in zip(prompts, completions, strict=True)) / max(len(prompts), 1)
