"""The pseudo-gradient codecs' device paths (tensor ops where the tensors are), run on CPU tensors:
the same payload bytes, buffers and decoded updates as the host paths, the same refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protocol import changes, pulseloco, sparseloco
from protocol.errors import InvalidPositions, ProtocolError


def inputs(seed: int = 0) -> tuple[dict, dict, dict]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {"w": (128, 192), "v": (3000,), "b": (64,), "odd": (70, 90)}
    weights = {n: (torch.randn(s, generator=gen) * 0.02).bfloat16() for n, s in shapes.items()}
    delta = {n: torch.randn(s, generator=gen) * 1e-4 for n, s in shapes.items()}
    error = {n: torch.randn(s, generator=gen) * 1e-5 for n, s in shapes.items()}
    return weights, delta, error


def forced_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pulseloco.tensorbytes, "on_host", lambda t: False)
    monkeypatch.setattr(changes, "SLAB", 5_000)  # several slabs: ranks carried across them


@pytest.mark.parametrize("value_format", ["bf16", "fp32"])
@pytest.mark.parametrize("fraction", [1.0, 0.3])
def test_pulseloco_device_path_is_the_host_path(
    monkeypatch: pytest.MonkeyPatch, value_format: str, fraction: float
) -> None:
    codec = pulseloco.PulseLoCoCodec(value_format)
    weights, delta, error = inputs()
    payload, e_host, _ = codec.compress(delta, error, weights, fraction=fraction)
    update = codec.decompress(payload, weights)
    forced_device(monkeypatch)
    payload_dev, e_dev, _ = codec.compress(delta, error, weights, fraction=fraction)
    assert payload_dev == payload
    for name in weights:
        assert torch.equal(e_dev[name], e_host[name])
    got = codec.decompress(payload, weights)
    for name in weights:
        assert torch.equal(got[name], update[name])


def outcome(codec: pulseloco.PulseLoCoCodec, payload: bytes, weights: dict) -> object:
    try:
        return {k: v.tolist() for k, v in codec.decompress(payload, weights).items()}
    except ProtocolError as exc:
        return type(exc)


def test_pulseloco_device_decode_refuses_what_the_host_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Corrupted payloads: the device path raises the same error as the host path, or decodes the
    same update (a flipped mantissa bit is still a valid payload)."""
    codec = pulseloco.PulseLoCoCodec()
    weights, delta, error = inputs(1)
    payload = codec.compress(delta, error, weights)[0]
    gen = np.random.default_rng(0)
    bad = []
    for at in gen.integers(40, len(payload), 12).tolist():
        flipped = bytearray(payload)
        flipped[at] ^= 0x41
        bad.append(bytes(flipped))
    host = [outcome(codec, p, weights) for p in bad]
    forced_device(monkeypatch)
    assert [outcome(codec, p, weights) for p in bad] == host
    assert any(isinstance(h, type) for h in host)


def test_pulseloco_device_ranks_past_a_class_are_refused() -> None:
    w = torch.tensor([0.5, 0.25, 0.5, 1.0], dtype=torch.bfloat16)
    table = pulseloco.positions.ClassTable(np.array([126]), np.array([2]), np.array([pulseloco.positions.FULL]))
    with pytest.raises(InvalidPositions):  # class 126 (0.5) has 2 members: ranks 0, 2 do not exist
        pulseloco._place_on_device("w", w, table, np.array([0, 1]), np.ones(2, np.float32))
    with pytest.raises(InvalidPositions):  # a gap larger than the tensor
        pulseloco._place_on_device("w", w, table, np.array([0, 1 << 60]), np.ones(2, np.float32))
    out = pulseloco._place_on_device("w", w, table, np.array([0, 0]), np.array([3.0, 4.0], np.float32))
    assert out.tolist() == [3.0, 0.0, 4.0, 0.0]


@pytest.mark.parametrize("shape", [(128, 192), (5000,), (70, 90), (64, 64 * 70)])
def test_sparseloco_positions_match_the_chunk_order(shape: tuple[int, ...]) -> None:
    """Picks as gaps per chunk land where the encoder took them (64x64 tiles or flat runs)."""
    n = int(np.prod(shape))
    gen = torch.Generator().manual_seed(3)
    acc = torch.randn(shape, generator=gen)
    k = 64
    codec = sparseloco.SparseLoCoCodec(k=k)
    part, _ = codec._sparsify(acc.clone().reshape(-1), torch.Size(shape), k)
    cols = shape[1] if sparseloco.is_tiled(torch.Size(shape)) else 0
    got = sparseloco.picked_positions(torch.from_numpy(part.gaps.astype(np.int64)), k, n, cols)
    assert got is not None
    order = sparseloco.chunk_order(torch.Size(shape))
    co = acc.reshape(-1)[torch.from_numpy(order)] if order is not None else acc.reshape(-1)
    top = []
    for lo in range(0, n, sparseloco.CHUNK):
        chunk = co[lo : lo + sparseloco.CHUNK].abs()
        top += sorted((chunk.topk(min(k, chunk.numel())).indices + lo).tolist())
    want = torch.tensor(top) if order is None else torch.from_numpy(order)[torch.tensor(top)]
    assert torch.equal(got, want)


def test_sparseloco_picks_past_a_chunk_are_refused() -> None:
    gaps = torch.zeros(64 + 5, dtype=torch.int64)
    assert sparseloco.picked_positions(gaps, 64, 4096 + 5, 0) is not None
    gaps[10] = 4096 - 63  # the chunk's 64th pick would be at 4096
    assert sparseloco.picked_positions(gaps, 64, 4096 + 5, 0) is None
    gaps = torch.zeros(64 + 5, dtype=torch.int64)
    gaps[-1] = 1  # the tail's fifth pick past its 5 weights
    assert sparseloco.picked_positions(gaps, 64, 4096 + 5, 0) is None
    assert sparseloco.picked_positions(torch.zeros(3, dtype=torch.int64), 64, 4096 + 5, 0) is None
    gaps = torch.zeros(64 + 5, dtype=torch.int64)
    gaps[-2:] = 1 << 62  # would wrap a sum around to a valid-looking rank
    assert sparseloco.picked_positions(gaps, 64, 4096 + 5, 0) is None
