"""Were a batch's completions sampled from the round's weights? A statistical check under W_r.

    check = SamplingCheck(model, cfg)
    check.remember(r, w_r)                       # the validator's BF16 weights of round r
    problem = check.check(batch, sample)         # None, or why the batch was not sampled from W_r

Every other check of a rollout batch (`checks.py`) uses public facts: a worker can fabricate
completions (the answers it wants miners trained on), score them truthfully and pass. What it
cannot fake cheaply is their probability under the weights it claims to hold. A worker draws each
completion byte from p = softmax(logits / T) of W_r given the prompt and the bytes so far, so the
surprisal s = -log p(byte) of a sampled byte has mean H (the entropy of that step's distribution)
and variance V (its varentropy) given the prefix. Over the bytes of the checked groups,

    z = sum (s - H) / sqrt(sum V)        about N(0, 1) for an honest batch

(martingale central limit: each term has mean 0 given everything before it). Completions the
policy finds unlikely (wrong answers it does not believe, garbage) push z far above 0; chosen
completions likelier than sampling gives (greedy decoding) push it below. Surprisal cannot fall
below 0, so an honest z has a light left tail and a heavier right one (a rare byte sampled): on
the RL preset's warm start, 800 honest batches of 16 groups gave z from -2.3 to +3.8 (mean 0.0,
sd 0.97); a batch is refused below `Z_LOW` or above `Z_HIGH`. A policy that spreads its mass evenly
cannot tell fabricated completions from sampled ones, and need not: they are as likely as any.

This is a tolerance, not a bit-exact regeneration: a worker on other hardware (other kernels, the
same BF16 weights) passes. The validator checks a sample of each batch's groups (drawn with its own
secret, so a worker cannot know which) in one forward pass over their completions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from node.learn.model import CausalLM
from node.learn.rl.config import RLConfig
from node.learn.rl.grpo import completion_tensors
from node.learn.train import load_bf16_state
from protocol.rollouts import RolloutBatch, RolloutGroup
from protocol.state import State

Z_LOW, Z_HIGH = -4.5, 6.0
"""Refuse a batch whose z falls outside these (see the module docstring for the honest spread)."""
CHECKED_GROUPS = 16
"""Groups of each batch the validator checks (all of them in a batch of at most this many)."""


@torch.no_grad()
def sampling_z(model: CausalLM, groups: Sequence[RolloutGroup], temperature: float) -> float:
    """z of the completions of `groups` under `model` at `temperature` (see the module docstring)."""
    seqs = [(g.prompt, c) for g in groups for c in g.completions]
    block = getattr(getattr(model, "cfg", None), "block_size", None)
    tokens, mask = completion_tensors(seqs, block)  # (N, T), (N, T-1): 1 where the next byte was sampled
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        logits = model(tokens[:, :-1].to(device)).double().cpu() / temperature  # (N, T-1, V)
    finally:
        model.train(was_training)
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)  # (N, T-1)
    varentropy = (p * (logp + entropy[..., None]) ** 2).sum(-1)
    surprisal = -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    m = mask.double()
    deviation, variance = float(((surprisal - entropy) * m).sum()), float((varentropy * m).sum())
    if variance > 1e-12:
        return deviation / math.sqrt(variance)
    return math.inf if deviation > 1.0 else 0.0  # a deterministic policy: only its own bytes pass


def judge(z: float) -> str | None:
    if not Z_LOW <= z <= Z_HIGH:
        return f"completions not sampled from the round's weights (z = {z:+.1f})"
    return None


class SamplingCheck:
    """Checks batches against the validator's weights of the rounds a pool may draw on."""

    def __init__(self, model: CausalLM, cfg: RLConfig) -> None:
        self.model, self.cfg = model, cfg
        self.weights: dict[int, State] = {}  # round -> BF16 weights, the last `max_staleness + 1` rounds
        self.loaded: int | None = None

    def remember(self, round_: int, weights: State) -> None:
        """Keep W_round (a reference: the validator makes new tensors each round) and forget older ones."""
        self.weights[round_] = weights
        for r in [r for r in self.weights if r < round_ - self.cfg.max_staleness]:
            del self.weights[r]
        if self.loaded is not None and self.loaded not in self.weights:
            self.loaded = None

    def can_check(self, round_: int) -> bool:
        return round_ in self.weights

    def check(self, batch: RolloutBatch, sample: Sequence[int]) -> str | None:
        """Why the groups of `batch` at `sample` were not sampled from W_{batch.round}, or None."""
        if self.loaded != batch.round:
            load_bf16_state(self.model, self.weights[batch.round])
            self.loaded = batch.round
        groups = [batch.groups[i] for i in sample]
        return judge(sampling_z(self.model, groups, self.cfg.temperature))

    def forget_loaded(self) -> None:
        """Another user loaded other weights into the model (the held-out measure)."""
        self.loaded = None
