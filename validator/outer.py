"""The outer optimizer: SGD (optionally with Nesterov momentum) on the validator's FP32 master.

Pseudo-gradients point like gradients (Delta = W - W_local), so a step subtracts:

    buf = momentum * buf + g               (buf starts at zero; momentum 0 means plain SGD)
    d   = g + momentum * buf  if nesterov  else buf
    master -= lr * d

This is `torch.optim.SGD`'s rule, written out so the state is two plain dicts the validator
can save and load (`state_tensors` / `load_state_tensors`).

Bit-reproducible on any CPU and any thread count, because anyone may recompute it (`audit.py`):
every operation is elementwise and separate (a product, then a sum: never `add_(alpha=...)`,
whose vectorized body may fuse a multiply-add that its scalar tail does not, so the bytes would
depend on where a thread's chunk ends), carried out in float64 and rounded to float32 once at
the end. Elementwise IEEE operations are correctly rounded, so every machine gets the same bytes,
a GPU included (each operation a separate kernel, so none is fused): the master may live on one.

The step runs chunk by chunk (`CHUNK` elements of each tensor): the operations are elementwise,
so a chunk's bytes do not depend on where it starts.
`fp32_state()` is what the step reads (the master, and the momentum buffers when momentum is
on); its `state_hash` is the FP32 state hash a round result commits to before and after its step.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import BaseModel, Field

from protocol.errors import IncompatibleStates
from protocol.parsing import STRICT

_PREFIX = "momentum/"
# elements stepped at a time: the float64 temporaries of a chunk (a few MB) stay in cache, where a
# whole 0.5B tensor's went through memory several times over (about 10x slower on a CPU)
CHUNK = 1 << 18


class OuterConfig(BaseModel):
    """Outer step settings. Defaults are DiLoCo's (lr 0.7, Nesterov momentum 0.9)."""

    model_config = STRICT

    lr: float = Field(default=0.7, gt=0)
    """Outer learning rate: how far the master moves along the averaged pseudo-gradient."""
    momentum: float = Field(default=0.9, ge=0, lt=1)
    """Momentum of the outer step; 0 gives plain SGD (SparseLoCo's choice)."""
    nesterov: bool = True
    """Use Nesterov momentum (look-ahead); ignored when momentum is 0."""


class OuterOptimizer:
    """Owns the FP32 master weights and the momentum buffers."""

    def __init__(self, cfg: OuterConfig, master: Mapping[str, torch.Tensor]) -> None:
        wrong = sorted(name for name, t in master.items() if t.dtype != torch.float32)
        if wrong:
            raise IncompatibleStates(f"the master weights must be float32: {wrong[:5]}")
        self.cfg = cfg
        self.master = {name: t.detach().clone(memory_format=torch.contiguous_format) for name, t in master.items()}
        self.momentum = {name: torch.zeros_like(t) for name, t in self.master.items()}
        self.steps = 0

    def step(self, update: Mapping[str, torch.Tensor]) -> None:
        """Apply one averaged pseudo-gradient (same names and shapes as the master)."""
        if set(update) != set(self.master):
            raise IncompatibleStates(
                f"update names differ from the master's: {sorted(set(update) ^ set(self.master))[:5]}"
            )
        for name in sorted(self.master):
            g = update[name].to(torch.float32)
            if g.shape != self.master[name].shape:
                raise IncompatibleStates(f"{name}: update {tuple(g.shape)}, master {tuple(self.master[name].shape)}")
        for name in sorted(self.master):
            master, momentum = self.master[name].view(-1), self.momentum[name].view(-1)  # views: stepped in place
            # the update as FP32, as a payload carries it, where the master is (it may be decoded elsewhere)
            g = update[name].to(master.device, torch.float32).reshape(-1)
            for at in range(0, master.numel(), CHUNK):
                part = slice(at, at + CHUNK)
                self._step_part(master[part], momentum[part], g[part])
        self.steps += 1

    def _step_part(self, master: torch.Tensor, momentum: torch.Tensor, update: torch.Tensor) -> None:
        """The step on one chunk: the same elementwise operations whatever the chunk, so the same bytes."""
        mu, lr = self.cfg.momentum, self.cfg.lr
        g = update.double()
        if mu == 0:
            direction = g
        else:
            buf = (momentum.double() * mu + g).float()
            momentum.copy_(buf)
            direction = g + buf.double() * mu if self.cfg.nesterov else buf.double()
        master.copy_((master.double() - direction * lr).float())

    def fp32_state(self) -> dict[str, torch.Tensor]:
        """What the step reads: the master, plus the momentum buffers (`momentum/<name>`) when momentum is on."""
        state = dict(self.master)
        if self.cfg.momentum > 0:
            state.update({_PREFIX + name: t for name, t in self.momentum.items()})
        return state

    def bf16_weights(self) -> dict[str, torch.Tensor]:
        """The BF16 global weights nodes train from: the master rounded to nearest."""
        return {name: t.to(torch.bfloat16) for name, t in self.master.items()}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Momentum buffers as flat tensors (`momentum/<name>`), for a safetensors file."""
        return {_PREFIX + name: t.clone() for name, t in self.momentum.items()}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor], steps: int) -> None:
        """Restore momentum saved by `state_tensors`; checks every name and shape before changing anything."""
        expected = {_PREFIX + name: t for name, t in self.momentum.items()}
        if set(tensors) != set(expected):
            raise IncompatibleStates(f"saved outer state names differ: {sorted(set(tensors) ^ set(expected))[:5]}")
        for key, t in tensors.items():
            if t.shape != expected[key].shape or t.dtype != torch.float32:
                raise IncompatibleStates(
                    f"{key}: saved {t.dtype}{tuple(t.shape)}, expected float32{tuple(expected[key].shape)}"
                )
        for key, t in tensors.items():
            expected[key].copy_(t)
        self.steps = steps
