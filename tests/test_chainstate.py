"""The chain's CPU work checks each thing once, and still refuses every wrong checkpoint or patch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from node.roles.chainstate import apply_patch, checkpoint_bytes, load_pieces
from protocol import pulsesync
from protocol.errors import MalformedPayload, ProtocolError, StateHashMismatch
from protocol.pieces import checkpoint_index
from protocol.statehash import state_hash


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(1024, 700, generator=gen).to(torch.bfloat16),  # two chunks
        "b.bias": torch.randn(10, generator=gen).to(torch.bfloat16),
        "empty": torch.zeros(0, dtype=torch.bfloat16),
        "scalar": torch.tensor(1.5, dtype=torch.bfloat16),
    }


def nudged(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in weights.items():
        mask = (torch.rand(t.shape, generator=gen) < 0.05).to(torch.int16)
        out[name] = (t.view(torch.int16) + mask).view(torch.bfloat16)
    return out


def test_a_checkpoint_fetched_piecewise_loads_to_the_announced_state(tmp_path: Path) -> None:
    weights = state()
    blob = checkpoint_bytes(weights)
    (path := tmp_path / "cp").write_bytes(blob)
    loaded = load_pieces(path, checkpoint_index(blob), state_hash(weights))
    assert state_hash(loaded) == state_hash(weights)  # the test hashes; the loader needs not
    assert all(torch.equal(loaded[n].view(torch.int16), weights[n].view(torch.int16)) for n in weights)
    assert {n: t.shape for n, t in loaded.items()} == {n: t.shape for n, t in weights.items()}


def test_a_piecewise_load_refuses_an_index_of_another_state_or_file(tmp_path: Path) -> None:
    weights = state()
    blob = checkpoint_bytes(weights)
    (path := tmp_path / "cp").write_bytes(blob)
    index = checkpoint_index(blob)
    with pytest.raises(StateHashMismatch):
        load_pieces(path, index, state_hash(state(1)))
    path.write_bytes(blob[:-2])
    with pytest.raises(MalformedPayload):
        load_pieces(path, index, state_hash(weights))
    fp32 = {n: t.float() for n, t in weights.items()}
    blob32 = checkpoint_bytes(fp32)
    path.write_bytes(blob32)
    with pytest.raises(MalformedPayload, match="not BF16"):
        load_pieces(path, checkpoint_index(blob32), state_hash(fp32))


def test_a_patch_hashes_only_the_new_state_and_still_refuses_a_wrong_one() -> None:
    old, new = state(), nudged(state(), 1)
    h_old, h_new = state_hash(old), state_hash(new)
    patch = pulsesync.encode(old, new, old_hash=h_old, new_hash=h_new)
    applied = apply_patch(old, h_old, patch, h_new)
    assert state_hash(applied) == h_new
    with pytest.raises(StateHashMismatch):  # the round result names another state than the patch makes
        apply_patch(old, h_old, patch, state_hash(nudged(old, 2)))
    with pytest.raises(StateHashMismatch):  # the patch is for another base than the one held
        apply_patch(old, state_hash(state(3)), patch, h_new)
    other = nudged(old, 4)  # weights that are not the ones the held hash names: the walk or the new hash catches it
    with pytest.raises(ProtocolError):
        apply_patch(other, h_old, patch, h_new)
    tampered = bytearray(patch)
    tampered[-5] ^= 0x40
    with pytest.raises(ProtocolError):
        apply_patch(old, h_old, bytes(tampered), h_new)
