"""SparseLoCo: top-k per chunk, 2-bit values, the error-feedback invariant, size, lying headers.

What every codec must do (round trips, truncation, trailing bytes, caps, corruption, the caller's
tensors untouched) is in test_codec_contract.py.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import sparseloco
from protocol.codec import CodecStats
from protocol.errors import (
    InvalidPositions,
    MalformedPayload,
    NonFiniteValues,
)
from protocol.positions import log2_binomial
from protocol.sparseloco import CHUNK, SparseLoCoCodec, chunk_order, chunk_sizes
from protocol.state import StateDict

SHAPES = {"attn.weight": (128, 192), "ln.bias": (40,), "odd.weight": (100, 50), "wte.weight": (64, 64)}


def make_case(
    seed: int, scale: float = 1e-3, shapes: dict[str, tuple[int, ...]] = SHAPES
) -> tuple[StateDict, StateDict, StateDict]:
    g = torch.Generator().manual_seed(seed)
    weights = {n: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for n, s in shapes.items()}
    delta = {n: torch.randn(s, generator=g) * scale for n, s in shapes.items()}
    error = {n: torch.randn(s, generator=g) * scale for n, s in shapes.items()}
    return weights, delta, error


def clone(state: StateDict) -> StateDict:
    return {n: t.clone() for n, t in state.items()}


def same(a: StateDict, b: StateDict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


def chunks_of(t: torch.Tensor) -> list[np.ndarray]:
    flat = t.reshape(-1).numpy()
    perm = chunk_order(t.shape)
    co = flat[perm] if perm is not None else flat
    bounds = np.cumsum(chunk_sizes(t.numel()))
    return np.split(co, bounds[:-1])


def test_tiles_are_64x64_blocks() -> None:
    x = torch.arange(128 * 192).reshape(128, 192)
    perm = chunk_order(x.shape)
    assert perm is not None
    tiles = x.reshape(-1)[torch.from_numpy(perm)].reshape(-1, 64, 64)
    assert (
        torch.equal(tiles[0], x[:64, :64])
        and torch.equal(tiles[1], x[:64, 64:128])
        and torch.equal(tiles[3], x[64:, :64])
    )
    assert chunk_order(torch.Size((100, 50))) is None
    assert chunk_sizes(5000).tolist() == [CHUNK, 904]


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.sampled_from([1, 8, 64]), beta=st.sampled_from([0.0, 0.95, 1.0]))
def test_top_k_and_error_feedback_invariant(seed: int, k: int, beta: float) -> None:
    weights, delta, error = make_case(seed)
    codec = SparseLoCoCodec(k=k, beta=beta)
    payload, new_error, stats = codec.compress(delta, error, weights)
    sent = codec.decompress(payload, weights)
    for n in weights:
        acc = error[n] * beta + delta[n]
        assert torch.equal(new_error[n], acc - sent[n])  # bit for bit, in FP32
        if weights[n].dim() < 2:  # dense BF16: exact in real arithmetic
            assert torch.equal(sent[n].double() + new_error[n].double(), acc.double())
            continue
        picked = new_error[n] != acc
        untouched = ~picked
        assert torch.equal(new_error[n][untouched], acc[untouched])
        for a, p in zip(chunks_of(acc.abs()), chunks_of(picked), strict=True):
            assert p.sum() <= min(k, len(a))
            assert a[p].min(initial=np.inf) >= a[~p].max(initial=0)  # the largest magnitudes
        values = np.unique(sent[n][sent[n] != 0].numpy())
        assert len(values) <= 4  # 2-bit values: bin centroids
    sparse = sum(int(np.minimum(k, chunk_sizes(t.numel())).sum()) for t in weights.values() if t.dim() >= 2)
    dense = sum(t.numel() for t in weights.values() if t.dim() < 2)
    assert stats.sent == sparse + dense and stats.payload_bytes == len(payload)


def test_picked_positions_round_trip_exactly() -> None:
    weights, delta, error = make_case(7)
    codec = SparseLoCoCodec()
    payload, new_error, _ = codec.compress(delta, error, weights)
    sent = codec.decompress(payload, weights)
    for n in weights:
        acc = error[n] * 0.95 + delta[n]
        if weights[n].dim() >= 2:
            assert torch.equal(sent[n] != 0, new_error[n] != acc)


def test_bits_per_value_at_64_of_4096() -> None:
    """Positions within 2% of log2 C(4096, 64) / 64; everything in, dense 1-D gains included, <= 10 bits."""
    shapes = {f"h{i}.weight": (256, 256) for i in range(8)} | {"ln.weight": (256,), "ln.bias": (256,)}
    weights, delta, error = make_case(8, shapes=shapes)
    _, _, stats = SparseLoCoCodec().compress(delta, error, weights)
    n_sparse = 8 * 256 * 256 // 64
    bound = log2_binomial(CHUNK, 64) / 64
    assert 8 * stats.position_bytes / n_sparse < 1.02 * bound
    assert stats.bits_per_value <= 10.0
    assert stats.sent == n_sparse + 512


def test_bad_options() -> None:
    with pytest.raises(ValueError):
        SparseLoCoCodec(k=0)
    with pytest.raises(ValueError):
        SparseLoCoCodec(beta=1.5)


# -- hostile payloads --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def case() -> tuple[StateDict, bytes, CodecStats]:
    weights, delta, error = make_case(10)
    payload, _, stats = SparseLoCoCodec().compress(delta, error, weights)
    return weights, payload, stats


def rejects(
    payload: bytes, weights: StateDict, exc: type[Exception], codec: SparseLoCoCodec | None = None, **kw: int
) -> None:
    before = clone(weights)
    with pytest.raises(exc) as info:
        (codec or SparseLoCoCodec()).decompress(payload, weights, **kw)
    assert info.type is exc, f"expected {exc.__name__}, got {info.type.__name__}: {info.value}"
    assert same(weights, before)


# offsets in the payload for SHAPES: magic 4, version 1, count 1, digest 8, k 1; then the first
# sparse tensor in sorted order ("attn.weight"): theta 1, centroids 16
_K_AT, _THETA_AT, _CENTROIDS_AT = 14, 15, 16


def patched(payload: bytes, at: int, data: bytes) -> bytes:
    return payload[:at] + data + payload[at + len(data) :]


def test_header_lies(case: tuple[StateDict, bytes, CodecStats]) -> None:
    weights, payload, _ = case
    assert payload[_K_AT] == 64
    rejects(payload, weights, MalformedPayload, SparseLoCoCodec(k=32))  # another run's k
    rejects(patched(payload, _K_AT, b"\x20"), weights, MalformedPayload)
    rejects(patched(payload, _THETA_AT, b"\x00"), weights, MalformedPayload)  # theta 0 with partial chunks
    for bad in (float("nan"), float("inf")):
        rejects(patched(payload, _CENTROIDS_AT + 4, struct.pack("<f", bad)), weights, NonFiniteValues)
    first_count = _CENTROIDS_AT + 16  # 4 bin counts follow the centroids
    count = payload[first_count]
    assert count < 0x7F  # one-byte varint for this small case
    rejects(patched(payload, first_count, bytes([count + 1])), weights, MalformedPayload)


@pytest.mark.parametrize("where, extra", [(0, CHUNK), (63, 4000)])
def test_positions_beyond_a_chunk_are_rejected(monkeypatch: pytest.MonkeyPatch, where: int, extra: int) -> None:
    """An encoder that lies about one gap: past the chunk outright, or pushing the chunk's last rank out."""
    weights, delta, error = make_case(11)
    honest = sparseloco.chunk_gaps

    def lying(*args: torch.Tensor) -> np.ndarray:
        gaps = honest(*args).copy()
        gaps[where] += extra
        return gaps

    monkeypatch.setattr(sparseloco, "chunk_gaps", lying)
    payload = SparseLoCoCodec().compress(delta, error, weights)[0]
    monkeypatch.undo()
    rejects(payload, weights, InvalidPositions)
