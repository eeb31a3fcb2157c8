"""A smaller payload within the run's codec rules (a miner whose uplink cannot carry a whole one in
time): SparseLoCo sends fewer values per chunk, PULSELoCo the largest of its gated values, dense all;
what is left out stays in the error buffer, and the validator decodes it by the same rules."""

from __future__ import annotations

import pytest
import torch

from protocol.codec import DenseCodec
from protocol.errors import MalformedPayload
from protocol.pulseloco import PulseLoCoCodec
from protocol.sparseloco import SparseLoCoCodec
from protocol.state import StateDict

SHAPES = {"attn.weight": (128, 192), "ln.bias": (40,), "odd.weight": (100, 50)}


def case(seed: int = 0, scale: float = 3e-3) -> tuple[StateDict, StateDict]:
    g = torch.Generator().manual_seed(seed)
    weights = {n: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for n, s in SHAPES.items()}
    delta = {n: torch.randn(s, generator=g) * scale for n, s in SHAPES.items()}
    return weights, delta


def nonzero(update: StateDict) -> int:
    return sum(int((t != 0).sum()) for n, t in update.items() if t.dim() > 1)


def test_sparseloco_sends_fewer_values_per_chunk_and_keeps_the_rest() -> None:
    weights, delta = case()
    codec = SparseLoCoCodec(k=64, beta=0.95)
    full, _, full_stats = codec.compress(delta, None, weights)
    quarter, error, stats = codec.compress(delta, None, weights, fraction=0.25)
    assert len(quarter) < 0.5 * len(full)  # fewer values, each a little dearer (sparser gaps)
    sent = codec.decompress(quarter, weights)  # the validator's codec, with the run's k = 64
    assert nonzero(sent) <= nonzero(codec.decompress(full, weights)) // 4 + 3
    for name in SHAPES:  # nothing lost: sent + kept == beta * 0 + delta (one FP32 rounding at picked values)
        torch.testing.assert_close(sent[name] + error[name], delta[name], rtol=0, atol=1e-6)
    assert stats.sent < full_stats.sent


def test_sparseloco_refuses_more_values_per_chunk_than_the_run_sends() -> None:
    weights, delta = case()
    payload, _, _ = SparseLoCoCodec(k=128).compress(delta, None, weights)
    with pytest.raises(MalformedPayload, match="1 to 64"):
        SparseLoCoCodec(k=64).decompress(payload, weights)


def test_pulseloco_keeps_the_largest_gated_values() -> None:
    weights, delta = case()
    codec = PulseLoCoCodec()
    full, _, full_stats = codec.compress(delta, None, weights)
    part, error, stats = codec.compress(delta, None, weights, fraction=0.1)
    assert stats.sent <= full_stats.sent // 10 + len(SHAPES)
    assert len(part) < 0.3 * len(full)
    sent = codec.decompress(part, weights)
    for name in SHAPES:
        torch.testing.assert_close(sent[name] + error[name], delta[name], rtol=0, atol=0)  # exact, as always
        kept = sent[name] != 0
        if kept.any() and (~kept).any():  # what was sent is at least as large as what waits
            smallest_sent = delta[name][kept].abs().min()
            gated_left = (error[name] != 0) & ~kept
            assert smallest_sent >= 0.99 * delta[name][gated_left].abs().quantile(0.9)


def test_dense_cannot_send_less_and_fractions_are_checked() -> None:
    weights, delta = case()
    dense = DenseCodec()
    assert dense.compress(delta, None, weights, fraction=0.1)[0] == dense.compress(delta, None, weights)[0]
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            SparseLoCoCodec().compress(delta, None, weights, fraction=bad)
