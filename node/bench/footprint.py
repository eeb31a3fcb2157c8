"""What a miner holds, measured on its live tensors, and what one inner step keeps for the backward pass.

    state = miner_state(trainer)                   # weights, optimizer state, error buffer: bytes
    probe = probe_step(trainer.model, batch, ctx)  # one forward+backward: seconds, gradient bytes,
                                                   # activation bytes saved for backward
Nothing is estimated from a formula: bytes are summed over the storages the tensors use (each
storage once), and saved activations are counted with `torch.autograd.graph.saved_tensors_hooks`
(parameters, which the backward also keeps a reference to, are not counted as activations). A
probe step changes no weight: its gradients are dropped.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from node.learn.model import CausalLM
from node.learn.train import Batch


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a tied or viewed tensor counts once)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's per-parameter state tensors (moments; not scalar step counters)."""
    return storage_bytes(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim())


@dataclass(frozen=True)
class MinerState:
    params: int  # parameters (tied ones once)
    weight_bytes: int  # trainable weights, on the miner's device
    optimizer_bytes: int  # optimizer state, on the device
    error_bytes: int  # error-feedback buffer, host

    def per_param(self, value: int) -> float:
        return value / self.params


def miner_state(trainer: Any) -> MinerState:
    """Bytes a `Trainer` holds between rounds (after it trained once, so the optimizer state exists)."""
    params = list(trainer.model.parameters())
    error = trainer.error.values() if trainer.error is not None else []
    return MinerState(
        params=sum(p.numel() for p in params),
        weight_bytes=storage_bytes(params),
        optimizer_bytes=optimizer_bytes(trainer.optimizer),
        error_bytes=storage_bytes(error),
    )


@dataclass(frozen=True)
class StepProbe:
    tokens: int
    seconds: float  # forward + backward, no optimizer step
    grad_bytes: int
    activation_bytes: int  # saved for the backward pass, parameters excluded


def probe_step(model: CausalLM, batch: Batch, ctx: contextlib.AbstractContextManager[Any]) -> StepProbe:
    """One forward and backward pass on `batch` under `ctx` (e.g. autocast); gradients are dropped after."""
    x, y = batch
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    param_storages = {(str(p.device), p.untyped_storage().data_ptr()) for p in model.parameters()}
    saved: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = (str(t.device), t.untyped_storage().data_ptr())
        if key not in param_storages:
            saved[key] = t.untyped_storage().nbytes()
        return t

    model.train()
    model.zero_grad(set_to_none=True)
    _sync(device)
    start = time.perf_counter()
    with ctx, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model.loss(x, y)
        loss.backward()
    _sync(device)
    seconds = time.perf_counter() - start
    grads = storage_bytes(p.grad for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    return StepProbe(x.numel(), seconds, grads, sum(saved.values()))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
