"""Training primitives shared by miners, the validator's evaluation and the benchmarks.

- `bf16_state` / `load_bf16_state`: the BF16 weights a node ships and compares (one entry per
  tensor: tied aliases such as `head.weight` -> `wte.weight` appear once).
- `inner_train`: H AdamW steps on FP32 master weights, gradient clipping, per-step losses.
- `MemoryConfig`: what the inner loop spends memory on (BF16 AdamW moments, activation
  checkpointing, a BF16 error-feedback buffer, a BF16 pseudo-gradient); `make_optimizer`,
  `apply_memory` and `pseudo_gradient` honour it.
- `evaluate`: mean loss over batches without gradients.

Deterministic for a given model, config and batch source: nothing here draws random numbers.
Thread counts (`torch.set_num_threads`) are left to callers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

import torch
from pydantic import BaseModel, Field
from torch import nn

from node.learn.adamw16 import AdamWBF16
from node.learn.data import Corpus
from node.learn.model import CausalLM
from protocol.parsing import STRICT

Batch = tuple[torch.Tensor, torch.Tensor]  # inputs, targets: each (B, T) int64
BatchFn = Callable[[int], Batch]  # step index -> batch
StepHook = Callable[[int, float], None]  # (step index, loss) after the optimizer step


class InnerOptimConfig(BaseModel):
    """AdamW for the inner (local) steps, as in DiLoCo / PULSELoCo / SparseLoCo."""

    model_config = STRICT

    lr: float = Field(gt=0)
    """Peak learning rate."""
    beta1: float = Field(default=0.9, ge=0, lt=1)
    """AdamW first-moment decay."""
    beta2: float = Field(default=0.95, ge=0, lt=1)
    """AdamW second-moment decay."""
    eps: float = Field(default=1e-8, gt=0)
    """AdamW denominator epsilon."""
    weight_decay: float = Field(default=0.1, ge=0)
    """Decoupled weight decay, applied to matrices and embeddings (not to gains or biases)."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Maximum global L2 norm of the gradient."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warmup from lr/warmup_steps to lr over the first steps (counted from step 0)."""

    def lr_at(self, step: int) -> float:
        return self.lr * min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else self.lr


BF16_MAX_BETA = 1 - 2**-7  # BF16 moments lose relative updates below ~2^-9 (adamw16.py)


class MemoryConfig(BaseModel):
    """What a miner's inner loop keeps in memory, per parameter, beside its FP32 weights and gradients.

    Today's default is the first value of each field: FP32 AdamW moments (8 bytes per parameter),
    every activation kept for the backward pass, an FP32 error-feedback buffer (4 bytes, in host
    memory). `pulse bench memory` measures what each choice does to loss, bytes and time.
    """

    model_config = STRICT

    moments: Literal["fp32", "bf16"] = "fp32"
    """AdamW's two moments: FP32 (8 bytes per parameter) or BF16 (4; the step is computed in FP32)."""
    checkpointing: bool = False
    """Activation checkpointing: keep only each block's input and recompute the block in the backward
    pass. Exact (the same loss); about one more forward pass of compute per step."""
    error_feedback: Literal["fp32", "bf16"] = "fp32"
    """How the error-feedback buffer is stored between rounds (the codec works on it in FP32)."""
    pseudo_gradient: Literal["fp32", "bf16"] = "fp32"
    """How the pseudo-gradient W - W_local waits on the host for the codec: each tensor is computed in
    FP32, then stored as this (BF16: 2 bytes a parameter instead of 4); the codec widens it back one
    tensor at a time. BF16 is enough: the codec sends a value only at BF16 precision or coarser
    (PULSELoCo's gate asks whether it moves a BF16 weight and sends 8 significant bits; SparseLoCo
    sends 2 bits), so the half ulp BF16 storage loses is far below what any value carries, and
    error feedback keeps what was not sent for the next round."""

    def check_betas(self, inner: InnerOptimConfig) -> None:
        if self.moments == "bf16" and max(inner.beta1, inner.beta2) > BF16_MAX_BETA:
            raise ValueError(f"BF16 moments need AdamW betas <= {BF16_MAX_BETA} (1 - 2^-7): smaller updates round away")

    @property
    def error_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.error_feedback == "bf16" else torch.float32

    @property
    def delta_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.pseudo_gradient == "bf16" else torch.float32


DELTA_CHUNK = 1 << 22  # elements: the FP32 temporaries of one pseudo-gradient chunk (16 MiB each)


def pseudo_gradient(
    weights: Mapping[str, torch.Tensor], model: nn.Module, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """W - W_local on the host: FP32 arithmetic, stored as `dtype`. Computed DELTA_CHUNK elements at a
    time into the stored tensor, so no whole-tensor FP32 temporary exists beside it (an embedding is a
    quarter of a 0.5B model); the values are those of the whole-tensor subtraction, bit for bit."""
    local = unique_state(model)
    out: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        into = torch.empty(w.shape, dtype=dtype)
        flat, wf, lf = into.view(-1), w.reshape(-1), local[name].detach().reshape(-1)
        for at in range(0, flat.numel(), DELTA_CHUNK):
            end = at + DELTA_CHUNK
            flat[at:end] = wf[at:end].float() - lf[at:end].float().cpu()
        out[name] = into
    return out


def unique_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model.state_dict()` with aliases dropped: the first name (in state-dict order) of a tensor wins.

    The tied GPT lists the same tensor as `wte.weight` and `head.weight`; only `wte.weight` stays.
    Only exact aliases (same storage, offset, shape and strides) are merged.
    """
    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = set()
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        storage = tensor.untyped_storage().data_ptr()
        alias = (storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if alias not in seen:
            seen.add(alias)
            state[name] = tensor
    return state


def bf16_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU BF16 copy of the model's unique state (what a node ships)."""
    return {
        name: tensor.detach().to(device="cpu", dtype=torch.bfloat16, copy=True).contiguous()
        for name, tensor in unique_state(model).items()
    }


def load_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` (names as `unique_state` gives them) into the model, casting to its dtypes.

    Raises `ValueError` on missing or unexpected names or a shape mismatch, before changing anything.
    """
    target = unique_state(model)
    missing, unexpected = sorted(set(target) - set(state)), sorted(set(state) - set(target))
    if missing or unexpected:
        raise ValueError(f"state does not match the model: missing {missing}, unexpected {unexpected}")
    for name, tensor in target.items():
        if state[name].shape != tensor.shape:
            raise ValueError(f"{name}: shape {tuple(state[name].shape)}, model has {tuple(tensor.shape)}")
    with torch.no_grad():
        for name, tensor in target.items():
            tensor.copy_(state[name])  # state_dict tensors share storage with the parameters


def load_bf16_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Set the model's (FP32) weights to the BF16 `state` exactly; see `load_state` for errors."""
    wrong = sorted(name for name, tensor in state.items() if tensor.dtype != torch.bfloat16)
    if wrong:
        raise ValueError(f"not bfloat16: {wrong}")
    load_state(model, state)


def changed_fraction(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> float:
    """Share of BF16 weights whose bits differ between two states (what a PULSESync patch carries)."""
    changed = sum(int((old[n].view(torch.int16) != t.view(torch.int16)).sum()) for n, t in new.items())
    return changed / max(sum(t.numel() for t in new.values()), 1)


def make_optimizer(
    model: nn.Module, cfg: InnerOptimConfig, memory: MemoryConfig | None = None
) -> torch.optim.Optimizer:
    """AdamW with weight decay on tensors of 2+ dims only (the nanoGPT convention); BF16 moments
    (`AdamWBF16`) where `memory` asks for them."""
    params = [p for p in model.parameters() if p.requires_grad]  # parameters() skips tied aliases
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if memory is not None and memory.moments == "bf16":
        memory.check_betas(cfg)
        return AdamWBF16(groups, lr=cfg.lr_at(0), betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    return torch.optim.AdamW(groups, lr=cfg.lr_at(0), betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def apply_memory(model: CausalLM, memory: MemoryConfig) -> None:
    """Set the model-side memory options (activation checkpointing) of `memory`."""
    if memory.checkpointing:
        model.set_checkpointing(True)


def autocast(device: torch.device, enabled: bool, memory: MemoryConfig) -> torch.autocast:
    """BF16 autocast for the inner steps. With checkpointing its weight cache is off: the cache would
    keep a BF16 copy of every weight (2 bytes per parameter) through the whole step, where without it
    only the block being (re)computed holds its copies."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled, cache_enabled=not memory.checkpointing)


def inner_train(
    model: CausalLM,
    cfg: InnerOptimConfig,
    batches: BatchFn,
    steps: int,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    first_step: int = 0,
    on_step: StepHook | None = None,
) -> list[float]:
    """Run `steps` AdamW steps and return each step's training loss (before its update).

    Step i uses `batches(first_step + i)` and the warmup schedule at that index. Pass `optimizer`
    (from `make_optimizer`) to keep AdamW moments across calls; by default a fresh one is made.
    `on_step(step, loss)` runs after each update, e.g. to snapshot the BF16 state.
    """
    opt = optimizer if optimizer is not None else make_optimizer(model, cfg)
    model.train()
    losses: list[float] = []
    for step in range(first_step, first_step + steps):
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        x, y = batches(step)
        loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
    return losses


def evaluate(model: CausalLM, batches: Iterable[Batch]) -> float:
    """Mean loss over `batches` (each weighted equally), without gradients; restores the mode."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            losses = [model.loss(x, y).item() for x, y in batches]
    finally:
        model.train(was_training)
    if not losses:
        raise ValueError("evaluate needs at least one batch")
    return sum(losses) / len(losses)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed named by `parts` (e.g. ("base", 0)), the same on every machine."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def corpus_batches(corpus: Corpus, seed: int, batch_size: int, seq_len: int, split: str = "train") -> BatchFn:
    """Batch source: step i draws the corpus batch seeded by (seed, i)."""
    return lambda step: corpus.batch(derive_seed(seed, step), batch_size, seq_len, split)
