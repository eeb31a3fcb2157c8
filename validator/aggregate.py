"""Aggregation of the selected pseudo-gradients: clip each to the median norm, then average.

    result = aggregate(payloads, lambda p: codec.decompress(p, weights, max_bytes=cap))

Norms are global L2 norms over all tensors (float64). Each update is scaled by
min(1, median / norm), so no single submission counts for more than a typical one, and the
scaled updates are averaged. At most one decoded update is held at a time: without precomputed
norms the payloads are decoded twice (a norm pass, then a sum pass).

Bit-reproducible: the norms are summed in one fixed order (`global_norm`), the clip factors are
computed in Python from them, and the sum of the updates is elementwise (a product, then an
addition, each correctly rounded) in float64 in the given order, so norms and mean have the same
bytes on every CPU and thread count. An auditor recomputes all of it (`audit.py`).

On any device: every step runs where the decoded updates are (a GPU when the codec decodes into
one), and because each is a separate elementwise IEEE float64 operation (no reduction whose
order follows the hardware, no fused multiply-add: a product and a sum are separate kernels),
a GPU gets the bytes a CPU gets; an auditor on another device recomputes the same decision.

Payloads reaching this point were already validated (decoded once by the round logic); a decode
error here propagates as the `ProtocolError` it is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from protocol.state import State, StateDict

P = TypeVar("P")  # a payload, or whatever `decode` reads one from


@dataclass(frozen=True)
class Aggregate:
    update: StateDict  # FP32 mean of the clipped updates
    norms: list[float]  # global L2 norm of each input, before clipping
    clip_to: float  # the median norm
    scales: list[float]  # factor each input was multiplied by


BLOCK = 1 << 14  # width of the accumulator in `sum_of_squares`
GROUP = 64  # rows of BLOCK values squared and folded at once


def global_norm(update: State) -> float:
    """L2 norm over every tensor of `update`: the same float on every machine and thread count.

    `sum_of_squares` per tensor, added in sorted-name order. A torch `sum` takes about as long but
    its order depends on the vector width and the threads, and an auditor must get the validator's
    norms bit for bit (they decide the clip factors).
    """
    total = 0.0
    for name in sorted(update):
        total += sum_of_squares(update[name])
    return math.sqrt(total)


def sum_of_squares(t: torch.Tensor) -> float:
    """The sum of the squares of `t`'s values in float64, in one fixed order.

    A square of an FP32 value is exact in float64. The nonzero values (zeros add nothing; a sparse
    update has few nonzeros) are read in flat order as rows of BLOCK; each group of rows is folded
    into one by halving (elementwise additions of the first and second half), the groups' rows are
    added into a BLOCK-wide accumulator in order, and the accumulator is halved down to one value.
    Every operation is elementwise, so vector width and threads change nothing.
    """
    flat = t.detach().reshape(-1)
    flat = flat[flat != 0]
    full = flat.numel() // BLOCK
    acc = torch.zeros(BLOCK, dtype=torch.float64, device=flat.device)
    rows = flat[: full * BLOCK].view(full, BLOCK)
    for start in range(0, full, GROUP):
        group = rows[start : start + GROUP].double()
        acc.add_(_halve(group.mul_(group)))
    rest = flat[full * BLOCK :]
    if rest.numel():
        tail = torch.zeros(BLOCK, dtype=torch.float64, device=flat.device)
        tail[: rest.numel()] = rest.double()
        acc.add_(tail.mul_(tail))
    return float(_halve(acc.view(BLOCK, 1)).item())


def _halve(rows: torch.Tensor) -> torch.Tensor:
    """(k, w) float64 -> (w,): the sum over the rows, by adding the second half to the first until one is left."""
    while rows.shape[0] > 1:
        if rows.shape[0] % 2:
            rows = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
        half = rows.shape[0] // 2
        rows = rows[:half] + rows[half:]
    return rows[0]


def clip_scales(norms: Sequence[float]) -> tuple[float, list[float]]:
    """(median norm, per-input factor min(1, median / norm)); a zero norm keeps factor 1."""
    median = statistics.median(norms)
    return median, [min(1.0, median / n) if n > 0 else 1.0 for n in norms]


def aggregate(
    payloads: Sequence[P],
    decode: Callable[[P], State],
    *,
    norms: Sequence[float] | None = None,
) -> Aggregate:
    """Median-norm-clipped mean of the decoded payloads. `norms`, if given, skips the norm pass."""
    if not payloads:
        raise ValueError("aggregate needs at least one payload")
    if norms is None:
        norms = [global_norm(decode(p)) for p in payloads]
    elif len(norms) != len(payloads):
        raise ValueError(f"{len(norms)} norms for {len(payloads)} payloads")
    clip_to, scales = clip_scales(norms)
    total: StateDict = {}
    for payload, scale in zip(payloads, scales, strict=True):
        update = decode(payload)
        for name in sorted(update):
            term = update[name].double() * scale
            if name in total:
                total[name] += term
            else:
                total[name] = term
        del update  # invariant: one decoded update alive at a time
    mean = {name: (t / len(payloads)).float() for name, t in total.items()}
    return Aggregate(update=mean, norms=list(norms), clip_to=clip_to, scales=scales)
