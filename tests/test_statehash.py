"""The state hash (v2): a commitment to the whole state, built from chunk digests checkable one by one."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import torch

from protocol import pulsesync
from protocol.statehash import (
    CHUNK_BYTES,
    CHUNK_DOMAIN,
    DOMAIN,
    chunk_digest,
    state_digests,
    state_hash,
    verify_piece,
)
from protocol.tensorbytes import bits, from_bits


def sample_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    big = CHUNK_BYTES // 2 + 1000  # BF16: two chunks, the second short
    return {
        "b.big": torch.randn(big, generator=gen).bfloat16(),
        "a.w": torch.randn(3, 5, generator=gen),
        "c.empty": torch.zeros(0, dtype=torch.float16),
    }


def test_independent_of_order_and_strides() -> None:
    state = sample_state()
    shuffled = {k: state[k] for k in reversed(list(state))}
    strided = dict(state)
    strided["a.w"] = state["a.w"].t().contiguous().t()  # same values, other strides
    assert not strided["a.w"].is_contiguous()
    assert state_hash(state) == state_hash(shuffled) == state_hash(strided)


def test_any_difference_changes_the_hash() -> None:
    state = sample_state()
    h = state_hash(state)
    flipped = dict(state)
    raw = bits(state["b.big"]).copy()
    raw[-1] ^= 1  # one bit in the second chunk
    flipped["b.big"] = from_bits(raw, "bfloat16", tuple(state["b.big"].shape))
    renamed = {("a.v" if k == "a.w" else k): v for k, v in state.items()}
    reshaped = dict(state, **{"a.w": state["a.w"].reshape(5, 3)})  # same bytes, other shape
    retyped = dict(state, **{"b.big": state["b.big"].view(torch.float16)})  # same bits, other dtype
    hashes = {state_hash(s) for s in (flipped, renamed, reshaped, retyped)}
    assert len(hashes) == 4 and h not in hashes


def test_the_root_is_the_documented_preimage() -> None:
    """Pinned by hand from the module docstring, so that every node computes the same thing."""
    state = {"x": torch.tensor([1.0, -2.0], dtype=torch.float32)}
    data = np.array([1.0, -2.0], dtype="<f4").tobytes()
    chunk = hashlib.sha256(CHUNK_DOMAIN + data).digest()

    def field(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    pre = DOMAIN + struct.pack("<Q", 1) + field(b"x") + field(b"float32") + field(struct.pack("<Q", 2))
    pre += struct.pack("<Q", 1) + chunk
    assert state_hash(state) == hashlib.sha256(pre).hexdigest()


def test_pieces_verify_one_by_one() -> None:
    state = sample_state()
    digests = state_digests(state)
    assert digests.root() == state_hash(state)
    pieces = list(digests.pieces())
    assert [(n, off, size) for n, off, size, _ in pieces] == [
        ("a.w", 0, 60),
        ("b.big", 0, CHUNK_BYTES),
        ("b.big", CHUNK_BYTES, 2000),
    ]
    raw = bits(state["b.big"]).view(np.uint8)
    second = raw[CHUNK_BYTES:].tobytes()
    assert verify_piece(digests, "b.big", CHUNK_BYTES, second)
    assert not verify_piece(digests, "b.big", 0, second)  # right bytes, wrong place
    assert not verify_piece(digests, "b.big", CHUNK_BYTES, second[:-1] + b"\x00")
    assert not verify_piece(digests, "nope", 0, second)
    assert chunk_digest(second) == pieces[2][3]


def test_apply_returns_the_verified_digests_of_the_new_state() -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(CHUNK_BYTES // 2 + 7, generator=gen) * 0.02
    old = {"w": w.bfloat16(), "z": torch.zeros(9, dtype=torch.bfloat16)}
    new = {"w": (w - 1e-5 * torch.randn(w.shape, generator=gen)).bfloat16(), "z": old["z"] + 1}
    patch = pulsesync.encode(old, new)
    got, digests = pulsesync.apply_with_digests(old, patch, held_hash=state_hash(old))
    assert digests == state_digests(new) and digests.root() == state_hash(got) == state_hash(new)
