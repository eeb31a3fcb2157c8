"""The CPU side of holding the chain: a checkpoint made the live state, a patch applied.

    weights = load_pieces(path, index, state_hash)          # a checkpoint fetched piece by piece
    weights = load_checkpoint(data, state_hash)             # a checkpoint fetched whole
    new = apply_patch(weights, held_hash, patch, new_hash)  # W_{r+1} from W_r and round r's patch

Each raises a `ProtocolError` subclass (nothing is returned) when the bytes are not what the
validator announced: a node never holds weights that do not hash to the hash it holds them under.

Each check is made once, and no full pass over the state is made that a check already made stands
for (a 0.5B state is about 1 GB: every pass costs a joiner about a second of a core per GB):

- a checkpoint fetched piece by piece is not hashed again: every piece was checked against its
  digest in the piece index as it arrived (`net/pieces.py`), and the index's digests and layout
  commit to the announced state hash (`PieceIndex.check_root`, done before the first piece). The
  state is built from the index's layout alone (never from the blob's own safetensors header),
  over the file's bytes read once, without a copy per tensor: so it hashes to the announced hash
  by construction.
- a patch is applied to a state whose hash the node already holds (it was checked when that state
  was made), so only the new state is hashed, slab by slab while it is still in cache, by the
  apply itself (`pulsesync.apply_with_digests`); its root is then compared with the round result's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
    """The BF16 state in the checkpoint at `path`, whose every piece passed its check against
    `index` (`net/pieces.py`), where `index.check_root(expect_hash)` passed: the tensors are views
    of one buffer holding the file, laid out as the index says."""
    index.check_root(expect_hash)  # cheap (digests only); makes this function safe on its own terms
    if any(t.dtype != "bfloat16" for t in index.tensors):
        raise MalformedPayload("checkpoint holds tensors that are not BF16")
    if path.stat().st_size != index.blob_size:
        raise MalformedPayload(f"checkpoint file has {path.stat().st_size} bytes, its index {index.blob_size}")
    buffer = torch.empty(index.blob_size, dtype=torch.uint8)
    _read_into(path, buffer.numpy())
    state = {}
    for t in index.tensors:
        raw = buffer[t.offset : t.offset + t.nbytes]
        if t.offset % 2:  # a view starts on an element boundary (safetensors aligns every tensor to 8 bytes)
            raw = raw.clone()
        state[t.name] = raw.view(torch.bfloat16).view(t.shape)
    return state


def _read_into(path: Path, out: np.ndarray) -> None:
    view, done = out.data.cast("B"), 0
    with path.open("rb", buffering=0) as f:
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:
                raise MalformedPayload(f"checkpoint file ended at byte {done} of {len(view)}")
            done += n


def apply_patch(weights: State, held_hash: str, patch: bytes, new_hash: str) -> State:
    """The state `patch` makes of `weights`, which hash to `held_hash` (the caller's word: it checked
    them when it made them); the new state must hash to `new_hash`, and is hashed once."""
    new, digests = pulsesync.apply_with_digests(weights, patch, held_hash=held_hash)
    got = digests.root()  # the patch's own named result, already checked against these digests
    if got != new_hash:
        raise StateHashMismatch(f"patch gave state {got[:12]}..., the round result names {new_hash[:12]}...")
    return new
