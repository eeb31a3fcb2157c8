"""`pulse bench links --cpu-only`: the CPU work of a join, phase by phase, in one process (no network).

A random BF16 state (`swarm/frozenrun.py`), its checkpoint, piece index and `--patches` sparse
patches (1% of values changed each) are made first, untimed; then the joiner's own code runs on
them in the order a join does, each phase timed:

- `pieces`: every piece checked against its digest and written in place, as `net/pieces.py` does
  when it arrives (this overlaps the download; the phases after it do not)
- `commit`: the complete partial file made the blob in the store (`PartialBlob.commit`)
- `load`: the blob made the live state (`roles/chainstate.load_pieces`)
- `patch N`: round N's patch applied and checked (`roles/chainstate.apply_patch`)

Figures: seconds and seconds per GiB of state for each phase, and `after_download_seconds`, the
CPU time a join adds after its last byte arrives (everything but `pieces`). With `--repeat N` the
phases run N times on the same bytes and each figure is the fastest (the machine may be shared).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from node.net.blobstore import BlobStore
from node.net.pieces import PartialBlob, Piece
from node.roles.chainstate import apply_patch, checkpoint_bytes, load_pieces
from node.swarm.frozenrun import changed, random_state
from protocol import pulsesync
from protocol.pieces import PieceIndex, checkpoint_index
from protocol.statehash import state_hash

T = TypeVar("T")


def phases(state_bytes: int, patches: int, repeat: int = 1) -> dict[str, Any]:
    """Time each CPU phase of a join to a state of about `state_bytes` with `patches` patches after
    it; each phase's figure is its fastest of `repeat` runs (the least disturbed by other work)."""
    blob, index, chain, announced = _frozen(state_bytes, patches)
    gib = len(blob) / 2**30
    runs = [_one_join(blob, index, chain, announced) for _ in range(max(1, repeat))]
    seconds = {name: min(run[name] for run in runs) for name in runs[0]}
    after = sum(s for name, s in seconds.items() if name != "pieces")
    return {
        "state_bytes": len(blob),
        "patches": patches,
        "repeat": len(runs),
        "seconds": seconds,
        "seconds_per_gib": {name: s / gib for name, s in seconds.items()},
        "after_download_seconds": after,
        "after_download_seconds_per_gib": after / gib,
    }


def _one_join(blob: bytes, index: PieceIndex, chain: list[tuple[bytes, str]], announced: str) -> dict[str, float]:
    seconds: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], T]) -> T:
        gc.collect()
        start = time.perf_counter()
        out = fn()
        seconds[name] = time.perf_counter() - start
        return out

    with tempfile.TemporaryDirectory(prefix="pulse-joincpu-") as folder:
        store = BlobStore(Path(folder) / "blobs")
        partial = PartialBlob(store, hashlib.sha256(blob).hexdigest(), len(blob))
        timed("pieces", functools.partial(_arrive, partial, index, blob))
        path = timed("commit", partial.commit)
        weights = timed("load", lambda: load_pieces(path, index, announced))
        held = announced
        for i, (patch, new_hash) in enumerate(chain):
            weights = timed(f"patch {i}", functools.partial(apply_patch, weights, held, patch, new_hash))
            held = new_hash
    return seconds


def _frozen(state_bytes: int, patches: int) -> tuple[bytes, PieceIndex, list[tuple[bytes, str]], str]:
    """(checkpoint blob, its index, [(patch, hash after it)], the checkpoint's state hash)."""
    weights = random_state(state_bytes, 0)
    first = h = state_hash(weights)
    blob = checkpoint_bytes(weights)
    index = checkpoint_index(blob)
    chain = []
    for r in range(patches):
        new = changed(weights, 0.01, r + 1)
        new_hash = state_hash(new)
        chain.append((pulsesync.encode(weights, new, old_hash=h, new_hash=new_hash), new_hash))
        weights, h = new, new_hash
    return blob, index, chain, first


def _arrive(partial: PartialBlob, index: PieceIndex, blob: bytes) -> None:
    view = memoryview(blob)
    for offset, length, digest in index.pieces():
        piece = Piece(offset, length, digest)
        data = bytes(view[offset : offset + length])  # a piece arrives as its own bytes
        if not PieceIndex.check(piece.digest, data):
            raise AssertionError(f"piece at {offset} fails its own digest")
        partial.write(offset, data)
