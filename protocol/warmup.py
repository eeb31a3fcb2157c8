"""Compile every codec kernel once, so that no node compiles one in the middle of a round.

The codecs' loops are compiled by numba on first use and cached on disk beside their modules
(`__pycache__`), keyed by source and argument types; a cold compile of all of them takes tens of
seconds on a small machine, a cached load a fraction of a second. `warm_up()` runs a tiny round
trip of every codec, with BF16, FP16 and FP32 weights, so that the cache holds every kernel a
node uses before the first process that needs one starts.
"""

from __future__ import annotations

import time

import torch

from protocol import pulsesync
from protocol.codec import REGISTRY, make_codec

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def warm_up() -> float:
    """Run every kernel once (compiling or loading it); the seconds it took."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    for dtype in _DTYPES:
        w = torch.randn(64, 64, generator=gen) * 0.02
        old = {"w": w.to(dtype), "b": torch.zeros(64, dtype=dtype)}
        new = {"w": (w + 1e-3 * torch.randn(64, 64, generator=gen)).to(dtype), "b": old["b"] + 1e-3}
        pulsesync.apply(old, pulsesync.encode(old, new))
    weights = {"w": (torch.randn(128, 128, generator=gen) * 0.02).bfloat16(), "b": torch.ones(64).bfloat16()}
    delta = {n: torch.randn(t.shape, generator=gen) * 1e-3 for n, t in weights.items()}
    for name in sorted(REGISTRY):
        codec = make_codec(name)
        codec.decompress(codec.compress(delta, None, weights)[0], weights)
    return time.perf_counter() - start
