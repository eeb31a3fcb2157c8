"""The embedded model: a small byte-level GPT that trains on a CPU.

Pre-norm transformer blocks (attention + MLP), learned position embeddings, tied input and
output embeddings. Shapes in comments: B batch, T time, C channels, V vocabulary (256 bytes).
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn
from torch.utils.checkpoint import checkpoint

from protocol.parsing import STRICT


class GPTConfig(BaseModel):
    """Sizes of the embedded GPT. The defaults give ~3.3M parameters."""

    model_config = STRICT

    vocab_size: int = Field(default=256, ge=2)
    """Tokens are bytes, so 256."""
    block_size: int = Field(default=128, ge=8)
    """Longest context in tokens."""
    n_layer: int = Field(default=4, ge=1)
    """Transformer blocks."""
    n_head: int = Field(default=4, ge=1)
    """Attention heads per block; must divide n_embd."""
    n_embd: int = Field(default=256, ge=8)
    """Channels of the residual stream."""


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd ({cfg.n_embd}) must be a multiple of n_head ({cfg.n_head})")
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)  # each (B, T, C)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False),
            nn.GELU(),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CausalLM(nn.Module):
    """What the node needs of a language model: logits (B, T, V) from token ids (B, T), and `loss`.

    The embedded GPT and the Hugging Face adapter (`node/learn/hfmodel.py`) both derive from it, so the
    inner loop, evaluation and BF16 state handling never ask which one they hold.
    """

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy in nats."""
        logits = self(x)  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def set_checkpointing(self, enabled: bool) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them (training only)."""
        raise NotImplementedError(f"{type(self).__name__} has no activation checkpointing")


class GPT(CausalLM):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied: one parameter, though state_dict() names it twice
        self.checkpointing = False
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))  # residual-path scaling

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) for token ids (B, T)."""
        _, t = idx.shape
        if t > self.cfg.block_size:
            raise ValueError(f"sequence of {t} tokens exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            # checkpointed: only each block's input (B, T, C) is kept; the block reruns in backward
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing and self.training else block(x)
        return self.head(self.ln_f(x))

    def set_checkpointing(self, enabled: bool) -> None:
        self.checkpointing = enabled


_GLOBAL_RNG = threading.Lock()  # held while `build_gpt` draws from torch's process-wide generator


def build_gpt(cfg: GPTConfig, seed: int = 0) -> GPT:
    """A freshly initialized GPT; the same seed gives the same weights on every machine.

    The init draws from torch's global generator, which every thread shares: two roles building
    the model at once in executor threads (one process, several nodes) would reseed it under each
    other's draws and get different W_0. The lock makes the seed, the draws and the restore one step.
    """
    with _GLOBAL_RNG:
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            return GPT(cfg)
        finally:
            torch.random.set_rng_state(gen_state)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
