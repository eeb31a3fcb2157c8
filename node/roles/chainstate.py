"""The CPU side of holding the chain: a checkpoint made the live state, a patch applied.

    weights = load_pieces(path, index, state_hash)          # a checkpoint fetched piece by piece
    weights = load_checkpoint(data, state_hash)             # a checkpoint fetched whole
    new = apply_patch(weights, held_hash, patch, new_hash)  # W_{r+1} from W_r and round r's patch

Each raises a `ProtocolError` subclass (nothing is returned) when the bytes are not what the
validator announced: a node never holds weights that do not hash to the hash it holds them under.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from protocol import pulsesync
from protocol.errors import MalformedPayload, StateHashMismatch
from protocol.pieces import PieceIndex
from protocol.state import State
from protocol.statehash import state_hash


def checkpoint_bytes(weights: State) -> bytes:
    return save_safetensors({n: t.contiguous() for n, t in weights.items()})


def load_checkpoint(data: bytes, expect_hash: str) -> State:
    """BF16 weights from checkpoint bytes (safetensors: never pickle), checked against `expect_hash`."""
    try:
        weights = dict(load_safetensors(data))
    except (SafetensorError, ValueError) as exc:
        raise MalformedPayload(f"checkpoint is not a safetensors file: {exc}") from exc
    if any(t.dtype != torch.bfloat16 for t in weights.values()):
        raise MalformedPayload("checkpoint holds tensors that are not BF16")
    got = state_hash(weights)
    if got != expect_hash:
        raise StateHashMismatch(f"checkpoint hashes to {got[:12]}..., announced {expect_hash[:12]}...")
    return weights


def load_pieces(path: Path, index: PieceIndex, expect_hash: str) -> State:
    """The checkpoint at `path`, fetched piece by piece against `index`."""
    del index
    return load_checkpoint(path.read_bytes(), expect_hash)


def apply_patch(weights: State, held_hash: str, patch: bytes, new_hash: str) -> State:
    """The state `patch` makes of `weights` (which hash to `held_hash`), which must hash to `new_hash`."""
    new = pulsesync.apply(weights, patch)
    got = state_hash(new)
    if got != new_hash:
        raise StateHashMismatch(f"patch gave state {got[:12]}..., the round result names {new_hash[:12]}...")
    return new
