"""Compile every codec kernel once, so that no node compiles one in the middle of a round.

The codecs' loops are compiled by numba on first use and cached on disk beside their modules
(`__pycache__`), keyed by source and argument types; a cold compile of all of them takes tens of
seconds on a small machine, a cached load a fraction of a second (0.4 s for PULSESync's decoder
alone, and over a second on a busy one). `warm_up()` runs a tiny round trip of PULSESync and of
codecs, so that those seconds are spent before a node needs a kernel, not in its first round:

    warm_up()                                   # every codec, BF16, FP16 and FP32 (tests, benches)
    warm_up_in_background([codec], BF16_ONLY)   # a node's start: its run's codec, beside its set-up
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import torch

from protocol import pulsesync
from protocol.codec import REGISTRY, Codec, make_codec

log = logging.getLogger(__name__)
ALL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BF16_ONLY = (torch.bfloat16,)  # the dtype of every state a run patches


def warm_up(codecs: Sequence[Codec] | None = None, dtypes: Sequence[torch.dtype] = ALL_DTYPES) -> float:
    """Run PULSESync for `dtypes` and each of `codecs` (default: every registered codec) once,
    compiling or loading every kernel they use; the seconds it took."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        w = torch.randn(64, 64, generator=gen) * 0.02
        old = {"w": w.to(dtype), "b": torch.zeros(64, dtype=dtype)}
        new = {"w": (w + 1e-3 * torch.randn(64, 64, generator=gen)).to(dtype), "b": old["b"] + 1e-3}
        pulsesync.apply(old, pulsesync.encode(old, new))
    weights = {"w": (torch.randn(128, 128, generator=gen) * 0.02).bfloat16(), "b": torch.ones(64).bfloat16()}
    delta = {n: torch.randn(t.shape, generator=gen) * 1e-3 for n, t in weights.items()}
    for codec in codecs if codecs is not None else [make_codec(name) for name in sorted(REGISTRY)]:
        codec.decompress(codec.compress(delta, None, weights)[0], weights)
    return time.perf_counter() - start


def warm_up_in_background(codecs: Sequence[Codec], dtypes: Sequence[torch.dtype] = BF16_ONLY) -> threading.Thread:
    """`warm_up` on a thread of its own, started: a node calls it first and goes on with its set-up
    (starting its network, finding the run, fetching a checkpoint), and a kernel it needs meanwhile
    waits only for what is left of that kernel's load. A daemon thread, so that a node stopped
    meanwhile does not wait for a cold compile; a failure is logged, never raised (the kernel fails
    again, with its error, where the node uses it)."""

    def run() -> None:
        try:
            log.debug("codec kernels ready in %.2fs", warm_up(codecs, dtypes))
        except Exception:  # a warm-up must not take a node down; the real call reports it
            log.warning("warming the codec kernels failed; they load on first use instead", exc_info=True)

    thread = threading.Thread(target=run, name="pulse-warm-up", daemon=True)
    thread.start()
    return thread
