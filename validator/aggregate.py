"""Aggregation of the selected pseudo-gradients: clip each to the median norm, then average.

    result = aggregate(payloads, lambda p: codec.decompress(p, weights, max_bytes=cap))

Norms are global L2 norms over all tensors (float64). Each update is scaled by
min(1, median / norm), so no single submission counts for more than a typical one, and the
scaled updates are averaged. At most one decoded update is held at a time: without precomputed
norms the payloads are decoded twice (a norm pass, then a sum pass).

Bit-reproducible: given the norms, the clip factors are computed in Python from them, and the sum
is elementwise (a product, then an addition, each correctly rounded) in float64 in the given
order, so the mean has the same bytes on every CPU and thread count. The norms themselves are
reductions (summation order may vary with threads in the last bits); a round result commits to
the norms it used, and an auditor recomputes the aggregate from those (`audit.py`).

Payloads reaching this point were already validated (decoded once by the round logic); a decode
error here propagates as the `ProtocolError` it is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from protocol.state import State, StateDict


@dataclass(frozen=True)
class Aggregate:
    update: StateDict  # FP32 mean of the clipped updates
    norms: list[float]  # global L2 norm of each input, before clipping
    clip_to: float  # the median norm
    scales: list[float]  # factor each input was multiplied by


def global_norm(update: State) -> float:
    """L2 norm over every tensor of `update`, accumulated in float64 in sorted-name order."""
    return math.sqrt(sum(float(update[name].double().square().sum()) for name in sorted(update)))


def clip_scales(norms: Sequence[float]) -> tuple[float, list[float]]:
    """(median norm, per-input factor min(1, median / norm)); a zero norm keeps factor 1."""
    median = statistics.median(norms)
    return median, [min(1.0, median / n) if n > 0 else 1.0 for n in norms]


def aggregate(
    payloads: Sequence[bytes],
    decode: Callable[[bytes], State],
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
