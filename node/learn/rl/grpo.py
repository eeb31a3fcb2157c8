"""GRPO: group-relative advantages, the clipped surrogate loss, and the miner's inner loop.

For the groups of a batch (prompt p, completions o_1..o_G, rewards r_1..r_G):

    A_i      = (r_i - mean(r)) / (std(r) + eps)              per group; a group of equal rewards gives 0
    ratio_it = exp(logp(o_it) - logp_old(o_it))              per completion token t
    J        = mean_i [ (1/|o_i|) sum_t min(ratio_it A_i, clip(ratio_it, 1-eps, 1+eps) A_i) ]
    loss     = -J + kl_coef * mean_i [ (1/|o_i|) sum_t k3_it ],  k3 = exp(q) - q - 1, q = logp_ref - logp

Each completion is averaged over its own tokens before the mean over completions (the original
GRPO normalization): at ratio 1 the objective is then exactly mean_i A_i, which is zero since
advantages are zero-mean within each group. The validator relies on that (`evaluator.py`).

Rewards are always recomputed from (prompt, completion) (`task.reward`): a worker's claimed
rewards are only compared with them (`task.verify_group`), never trained on.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from node.learn.model import CausalLM
from node.learn.rl.config import RLConfig
from node.learn.rl.task import reward
from node.learn.train import InnerOptimConfig, load_bf16_state, load_state, make_optimizer, pseudo_gradient
from protocol.rollouts import RolloutGroup
from protocol.state import State

ADVANTAGE_EPS = 1e-4


@dataclass(frozen=True)
class RolloutTensors:
    """A batch of rollout groups as tensors: N = completions, T = longest prompt + completion."""

    tokens: torch.Tensor  # (N, T) int64, prompt + completion from position 0, right-padded with 0
    mask: torch.Tensor  # (N, T-1) float32: 1 where the target tokens[:, t+1] is a completion byte
    advantages: torch.Tensor  # (N,) float32, zero-mean within each group
    rewards: torch.Tensor  # (N,) float32, recomputed
    groups: int  # number of groups (rows come group by group, G rows each)

    def to(self, device: torch.device) -> RolloutTensors:
        return RolloutTensors(
            self.tokens.to(device),
            self.mask.to(device),
            self.advantages.to(device),
            self.rewards.to(device),
            self.groups,
        )


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(groups, G) rewards -> (groups, G) advantages (r - mean) / (std + eps), population std."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, correction=0)
    return (rewards - mean) / (std + ADVANTAGE_EPS)


def completion_tensors(
    seqs: Sequence[tuple[bytes, bytes]], block_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt, completion) pairs -> tokens (N, T) right-padded with 0, completion mask (N, T-1)."""
    if any(not p for p, _ in seqs):
        raise ValueError("a prompt is empty")
    longest = max(len(p) + len(c) for p, c in seqs)
    if block_size is not None and longest > block_size:
        raise ValueError(f"a sequence of {longest} bytes exceeds block_size {block_size}")
    tokens = torch.zeros(len(seqs), longest, dtype=torch.long)
    mask = torch.zeros(len(seqs), max(longest - 1, 1), dtype=torch.float32)
    for i, (p, c) in enumerate(seqs):
        tokens[i, : len(p) + len(c)] = torch.tensor(list(p + c), dtype=torch.long)
        mask[i, len(p) - 1 : len(p) + len(c) - 1] = 1.0  # logits at t predict byte t+1
    return tokens, mask


def rollout_tensors(groups: Sequence[RolloutGroup], block_size: int | None = None) -> RolloutTensors:
    """Tokens, completion mask, rewards and advantages of `groups` (every group the same size G).

    Raises `ValueError` for an empty batch, groups of different sizes, a prompt that is not a task
    prompt, or a sequence longer than `block_size`.
    """
    if not groups:
        raise ValueError("a rollout batch needs at least one group")
    size = len(groups[0].completions)
    if any(len(g.completions) != size for g in groups):
        raise ValueError("rollout groups of different sizes in one batch")
    seqs = [(g.prompt, c) for g in groups for c in g.completions]
    tokens, mask = completion_tensors(seqs, block_size)
    rewards = torch.tensor([reward(p, c) for p, c in seqs], dtype=torch.float32)
    advantages = group_advantages(rewards.view(len(groups), size).double()).float().reshape(-1)
    return RolloutTensors(tokens, mask, advantages, rewards, len(groups))


def token_logps(model: CausalLM, tokens: torch.Tensor) -> torch.Tensor:
    """(N, T) tokens -> (N, T-1) log-probability of each next token under `model`."""
    logits = model(tokens[:, :-1]).float()  # (N, T-1, V)
    return -F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")


def _per_completion_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T-1) -> (N,): mean over each row's completion tokens (0 for an empty completion)."""
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def surrogate(
    logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float
) -> torch.Tensor:
    """The clipped GRPO objective J (a scalar to maximize); shapes as in `RolloutTensors`."""
    ratio = torch.exp(logp - logp_old)  # (N, T-1)
    adv = advantages[:, None]
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.minimum(ratio * adv, clipped * adv)
    return _per_completion_mean(per_token, mask).mean()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(policy || reference) per the k3 estimator exp(q) - q - 1, q = logp_ref - logp (>= 0 per token)."""
    q = ref_logp - logp
    return _per_completion_mean(torch.exp(q) - q - 1.0, mask).mean()


def grpo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """-J, plus `kl_coef` x KL(policy || reference) when reference log-probs are given."""
    loss = -surrogate(logp, logp_old, advantages, mask, clip_eps)
    if ref_logp is not None and kl_coef > 0:
        loss = loss + kl_coef * kl_k3(logp, ref_logp, mask)
    return loss


class GRPOTrainer:
    """A model and its AdamW state, kept across rounds like `node.roles.miner.Trainer`.

    `train` starts from the BF16 global weights and returns the FP32 pseudo-gradient; `steps`
    trains the held weights in place (the single-process baseline). Minibatch j of a call is the
    groups [j*m, (j+1)*m) cycling over the given groups (m = `minibatch_groups`, default all):
    deterministic, and the same for every node that trains on the same groups.
    """

    def __init__(
        self,
        model: CausalLM,
        inner: InnerOptimConfig,
        cfg: RLConfig,
        *,
        reference: Mapping[str, torch.Tensor] | None = None,
        minibatch_groups: int | None = None,
    ) -> None:
        if minibatch_groups is not None and minibatch_groups < 1:
            raise ValueError("minibatch_groups must be >= 1")
        self.model, self.inner, self.cfg = model, inner, cfg
        self.optimizer = make_optimizer(model, inner)
        self.minibatch_groups = minibatch_groups
        # the KL term needs the reference policy's log-probs: a frozen copy of the model at `reference`
        self.reference_model: CausalLM | None = None
        if reference is not None and cfg.kl_coef > 0:
            self.reference_model = copy.deepcopy(model).requires_grad_(False)
            load_state(self.reference_model, reference)
        self.steps_done = 0
        self.last_loss = float("nan")
        self.last_reward = float("nan")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def train(
        self,
        weights: Mapping[str, torch.Tensor],
        groups: Sequence[RolloutGroup],
        steps: int,
        on_step: Callable[[int], None] | None = None,
    ) -> State:
        """FP32 pseudo-gradient W - W_local after `steps` AdamW steps from the BF16 `weights` on `groups`
        (`on_step` as in `steps`)."""
        load_bf16_state(self.model, weights)
        self.steps(groups, steps, on_step)
        return pseudo_gradient(weights, self.model)

    def steps(
        self, groups: Sequence[RolloutGroup], steps: int, on_step: Callable[[int], None] | None = None
    ) -> list[float]:
        """`steps` AdamW steps on `groups` from the weights the model holds; the loss of each step.

        logp_old is taken once, at the weights held on entry (the policy the update starts from).
        `on_step(k)` runs after the k-th optimizer step of this call (e.g. to measure BF16 changes).
        """
        if steps < 1:
            raise ValueError("steps must be >= 1")
        if not groups:
            raise ValueError("no rollout groups to train on")
        block = getattr(getattr(self.model, "cfg", None), "block_size", None)
        m = self.minibatch_groups or len(groups)
        chunks = [_cycle(groups, j * m, m) for j in range(min(steps, _chunk_count(len(groups), m)))]
        batches = [rollout_tensors(c, block).to(self.device) for c in chunks]
        olds = [self._logps(self.model, b.tokens) for b in batches]
        refs = [self._logps(self.reference_model, b.tokens) if self._kl else None for b in batches]
        self.model.train()
        losses: list[float] = []
        for k in range(steps):
            j = k % len(batches)
            b = batches[j]
            for group in self.optimizer.param_groups:
                group["lr"] = self.inner.lr_at(self.steps_done)
            logp = token_logps(self.model, b.tokens)
            loss = grpo_loss(logp, olds[j], b.advantages, b.mask, self.cfg.clip_eps, refs[j], self.cfg.kl_coef)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.inner.grad_clip)
            self.optimizer.step()
            self.steps_done += 1
            losses.append(loss.item())
            if on_step is not None:
                on_step(k)
        self.last_loss = sum(losses) / len(losses)
        self.last_reward = float(torch.cat([b.rewards for b in batches]).mean())
        return losses

    @property
    def _kl(self) -> bool:
        return self.reference_model is not None and self.cfg.kl_coef > 0

    @staticmethod
    def _logps(model: CausalLM | None, tokens: torch.Tensor) -> torch.Tensor:
        assert model is not None
        with torch.no_grad():
            return token_logps(model, tokens)


def _chunk_count(n: int, m: int) -> int:
    """Distinct minibatches before the cycle repeats: lcm(n, m) / m."""
    return n // math.gcd(n, m)


def _cycle(groups: Sequence[RolloutGroup], start: int, m: int) -> list[RolloutGroup]:
    return [groups[(start + i) % len(groups)] for i in range(m)]
