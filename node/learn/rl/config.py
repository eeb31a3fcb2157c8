"""The `[rl]` section of a run manifest (`task = "rl"`): the task, GRPO and the rollout pool."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, Field, model_validator

from protocol.parsing import STRICT


class RLConfig(BaseModel):
    """Settings every node of an RL run agrees on (part of the run id)."""

    model_config = STRICT

    digits: int = Field(default=2, ge=1, le=6)
    """Operands of the arithmetic task have up to this many decimal digits."""
    group_size: int = Field(default=8, ge=2, le=64)
    """G: completions a worker samples per prompt; advantages are relative within the group."""
    prompts_per_batch: int = Field(default=16, ge=1, le=256)
    """Prompts in one worker's rollout batch per round (derived from run id, round and worker key)."""
    max_new_tokens: int = Field(default=6, ge=1, le=256)
    """Longest completion a worker generates (bytes for the embedded GPT)."""
    temperature: float = Field(default=1.0, gt=0.0, le=4.0)
    """Sampling temperature of the workers."""
    clip_eps: float = Field(default=0.2, gt=0.0, le=1.0)
    """GRPO's clipped importance ratio: 1 +- clip_eps."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight of the KL penalty to the warm-start (reference) policy; 0 turns it off."""
    max_staleness: int = Field(default=1, ge=0, le=16)
    """A rollout batch generated from the weights of round r may be trained on in rounds r .. r + this."""
    groups_per_batch: int = Field(default=8, ge=1, le=1024)
    """Groups in one batch drawn from the pool by a seed: a miner trains on the batches its assignment
    seeds draw, and the validator scores on one of them and on batches its own seeds draw."""
    pool_batches: int = Field(default=16, ge=1, le=64)
    """At most this many rollout batches in a round's pool (the validator picks, newest first)."""
    min_pool_batches: int = Field(default=1, ge=1, le=64)
    """The validator waits (up to `pool_wait_seconds`) until the pool has this many batches."""
    pool_wait_seconds: float = Field(default=30.0, gt=0.0, le=3600.0)
    """Longest the validator waits for rollouts before opening a round with a short pool."""
    warm_start_steps: int = Field(default=400, ge=0, le=100_000)
    """Supervised steps on task examples that make W_0 (cached on disk); 0 starts from the random init."""
    warm_start_lr: float = Field(default=2e-3, gt=0.0, le=1.0)
    """Learning rate of the supervised warm start."""
    held_out_prompts: int = Field(default=128, ge=1, le=4096)
    """Size of the fixed held-out prompt set the validator measures reward on (greedy decoding)."""
    reward_every: int = Field(default=1, ge=1, le=10_000)
    """The validator measures the held-out reward every this many rounds."""

    @model_validator(mode="after")
    def _pool_fits(self) -> Self:
        if self.min_pool_batches > self.pool_batches:
            raise ValueError("min_pool_batches exceeds pool_batches")
        return self
