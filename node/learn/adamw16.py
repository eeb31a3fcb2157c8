"""AdamW with its moments stored in BF16: 4 bytes of optimizer state per parameter instead of 8.

The step is torch's AdamW (decoupled weight decay, bias-corrected moments, eps outside the root)
computed in FP32 a chunk at a time; only the stored moments are rounded to BF16 (to nearest).
The weights and gradients stay FP32. Working memory is a few FP32 chunks of `CHUNK` elements,
never a full-size FP32 copy of a moment.

BF16 keeps 8 significant bits, so a moment changes each step only if its relative update is
above about 2^-9: (1 - beta) must not be tiny. `MemoryConfig` accepts betas up to 1 - 2^-7
(0.9921875); the inner loop's defaults (0.9, 0.95) are far from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

CHUNK = 1 << 18  # elements per FP32 working chunk: 1 MiB temporaries stay in cache


class AdamWBF16(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        assert p.grad is not None
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros(p.shape, dtype=torch.bfloat16, device=p.device)
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.bfloat16, device=p.device)
        state["step"] += 1
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        step_size = lr / (1 - beta1 ** state["step"])
        root_bc2 = math.sqrt(1 - beta2 ** state["step"])
        flat_p, flat_g = p.view(-1), p.grad.reshape(-1)
        flat_m, flat_v = state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1)
        for start in range(0, flat_p.numel(), CHUNK):
            end = start + CHUNK
            pc, gc = flat_p[start:end], flat_g[start:end]
            m = flat_m[start:end].float().lerp_(gc, 1 - beta1)
            v = flat_v[start:end].float().mul_(beta2).addcmul_(gc, gc, value=1 - beta2)
            if wd:
                pc.mul_(1 - lr * wd)
            pc.addcdiv_(m, v.sqrt().div_(root_bc2).add_(eps), value=-step_size)
            flat_m[start:end].copy_(m)
            flat_v[start:end].copy_(v)
