"""The checkpoint piece index: its pieces tile the blob, each checks alone, its digests are the state hash's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from node.roles.chainstate import checkpoint_bytes
from protocol.errors import MalformedPayload, ProtocolError, StateHashMismatch
from protocol.pieces import PieceIndex, checkpoint_index
from protocol.statehash import CHUNK_BYTES, state_hash


def state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(1024, 700, generator=gen).to(torch.bfloat16),  # 1.4 MB: two chunks
        "b.bias": torch.randn(10, generator=gen).to(torch.bfloat16),
        "empty": torch.zeros(0, dtype=torch.bfloat16),
    }


def test_pieces_tile_the_blob_and_commit_to_the_state_hash() -> None:
    weights = state()
    blob = checkpoint_bytes(weights)
    index = PieceIndex.from_bytes(checkpoint_index(blob).to_bytes(), size=len(blob))
    index.check_root(state_hash(weights))
    pieces = index.pieces()
    assert pieces[0][0] == 0 and sum(length for _, length, _ in pieces) == len(blob)
    assert max(length for _, length, _ in pieces[1:]) <= CHUNK_BYTES
    for offset, length, digest in pieces:
        assert PieceIndex.check(digest, blob[offset : offset + length])
    offset, length, digest = pieces[1]
    bad = bytearray(blob[offset : offset + length])
    bad[0] ^= 1
    assert not PieceIndex.check(digest, bytes(bad))


def test_an_index_of_another_state_is_refused() -> None:
    weights = state()
    index = checkpoint_index(checkpoint_bytes(weights))
    other = {**weights, "b.bias": weights["b.bias"] + 1}
    with pytest.raises(StateHashMismatch):
        index.check_root(state_hash(other))
    t = index.tensors[0]
    swapped = dataclasses.replace(index, tensors=(dataclasses.replace(t, chunks=t.chunks[::-1]), *index.tensors[1:]))
    with pytest.raises(StateHashMismatch):
        swapped.check_root(state_hash(weights))


def test_a_malformed_index_is_refused() -> None:
    blob = checkpoint_bytes(state())
    data = checkpoint_index(blob).to_bytes()
    for broken in (data[:-1], data + b"\0", b"XXXX" + data[4:]):
        with pytest.raises(ProtocolError):
            PieceIndex.from_bytes(broken, size=len(blob))
    with pytest.raises((MalformedPayload, ProtocolError)):
        PieceIndex.from_bytes(data, size=len(blob) + 1)  # does not tile the announced blob
