"""PULSESync's device path (torch ops where the tensors are), run on CPU tensors: the same
changes as the compiled host walk, the same patch bytes, decoded into device memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import changes, pulsesync, syncpass
from protocol.contexts import EXPONENT, NUM_CONTEXTS
from protocol.errors import ProtocolError, StateHashMismatch
from protocol.tensorbytes import bits
from tests.test_pulsesync import same_bits, weight_pair

WIDTH = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32}
NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def host_walk(old: torch.Tensor, new: torch.Tensor) -> tuple[np.ndarray, ...]:
    shift, emask = EXPONENT[NAMES[old.dtype]]
    n, last = np.zeros(NUM_CONTEXTS, np.int64), np.full(NUM_CONTEXTS, -1, np.int64)
    hist = np.zeros((NUM_CONTEXTS, syncpass.ALPHABET), np.int64)
    offsets = np.zeros(0, np.int32)
    cls, gap, zs = syncpass.collect(bits(old), bits(new), shift, emask, WIDTH[old.dtype], offsets, n, last, hist)
    return cls, gap, zs, n, hist


def device_pass(old: torch.Tensor, new: torch.Tensor) -> tuple[np.ndarray, ...]:
    shift, emask = EXPONENT[NAMES[old.dtype]]
    got = changes.collect(old, new, shift, emask, WIDTH[old.dtype])
    return got.cls, got.gap, got.zs, got.n, syncpass.value_histogram(got.cls, got.zs)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(0, 3000),
    density=st.sampled_from([0.0, 0.01, 0.3, 1.0]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    slab=st.sampled_from([64, 1000, changes.SLAB]),
)
def test_device_pass_finds_what_the_host_walk_finds(
    seed: int, n: int, density: float, dtype: torch.dtype, slab: int
) -> None:
    """Classes, gaps, values, class sizes and value histograms agree exactly, across slabs,
    including sign flips, large jumps and special values."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=gen) * 0.02
    w[::97] = 0.0
    old = w.to(dtype)
    step = torch.randn(n, generator=gen) * torch.rand(n, generator=gen).pow(8) * 0.05
    moved = (w - step).to(dtype)
    pick = torch.rand(n, generator=gen) < density
    new = torch.where(pick, moved, old)
    if n > 10:
        new[3] = float("inf")
        new[7] = -old[7]
    old_slab = changes.SLAB
    changes.SLAB = slab
    try:
        got = device_pass(old, new)
    finally:
        changes.SLAB = old_slab
    want = host_walk(old, new)
    for g, h in zip(got, want, strict=True):
        assert g.dtype.kind == h.dtype.kind and g.itemsize == h.itemsize
        assert np.array_equal(g, h)


def test_patch_bytes_are_the_same_on_either_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU tensor's path, forced on the CPU: byte-identical patches, decoded into a copy of
    the old tensor by scattering only the changes, both hash checks passing."""
    old, new = weight_pair(n=60_000)
    old["f32"] = torch.randn(500) * 0.1
    new["f32"] = old["f32"] + (torch.rand(500) < 0.05) * 1e-3
    old["same"] = torch.ones(40, dtype=torch.bfloat16)
    new["same"] = old["same"].clone()
    patch = pulsesync.encode(old, new)
    monkeypatch.setattr(pulsesync.tensorbytes, "on_host", lambda t: False)
    monkeypatch.setattr(changes, "SLAB", 10_000)
    assert pulsesync.encode(old, new) == patch
    stored: list[int] = []
    real_store = pulsesync._store
    monkeypatch.setattr(pulsesync, "_store", lambda *a: stored.append(int((a[3] != a[4]).sum())) or real_store(*a))
    assert same_bits(pulsesync.apply(old, patch), new)
    changed = sum(int((bits(old[k]) != bits(new[k])).sum()) for k in ("w", "f32"))
    assert sum(stored) == changed  # only the changes were scattered into the device copy


def test_device_decode_keeps_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device path shares parsing and bounds checks: a flipped stream byte or a wrong base
    is refused there too, and the held state is untouched."""
    old, new = weight_pair(n=20_000)
    patch = bytearray(pulsesync.encode(old, new))
    monkeypatch.setattr(pulsesync.tensorbytes, "on_host", lambda t: False)
    before = {k: bits(v).copy() for k, v in old.items()}
    patch[-20] ^= 0x5A
    with pytest.raises(ProtocolError):
        pulsesync.apply(old, bytes(patch))
    other, _ = weight_pair(seed=5, n=20_000)
    with pytest.raises(StateHashMismatch):
        pulsesync.apply(other, pulsesync.encode(old, new))
    assert all(np.array_equal(bits(old[k]), before[k]) for k in old)
