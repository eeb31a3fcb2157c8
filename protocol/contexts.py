"""What the receiver already knows about each weight: its exponent, and the order it induces.

A BF16 weight changes only when an update exceeds about half its ulp, and the ulp is set by the
exponent, so the old weight's exponent predicts both whether a weight changes and by how much.
Both ends compute the same context from the *old* state, so it costs no bits on the wire.

`ContextOrder` lists a tensor's positions class-major: all positions of context 0 in
increasing order, then context 1, and so on. A position's index in that list is its
"sorted index"; within one context, sorted indices are ranks, which is what gaps are coded on.
"""

from __future__ import annotations

import numpy as np

# dtype wire name -> (exponent shift, exponent mask)
_EXPONENT = {"bfloat16": (7, 0xFF), "float16": (10, 0x1F), "float32": (23, 0xFF)}
NUM_CONTEXTS = 256


def exponent_context(raw: np.ndarray, dtype: str) -> np.ndarray:
    """(n,) uint8 exponent field of each bit pattern in `raw` (uint16 or uint32)."""
    shift, mask = _EXPONENT[dtype]
    return ((raw >> shift) & mask).astype(np.uint8)


class ContextOrder:
    """Class-major order of one flat tensor's positions under a uint8 context."""

    def __init__(self, ctx: np.ndarray) -> None:
        # numpy's stable sort of 8-bit keys is a radix sort: linear time, positions stay ascending
        self.order = np.argsort(ctx, kind="stable")
        self.counts = np.bincount(ctx, minlength=NUM_CONTEXTS).astype(np.int64)
        self.starts = np.concatenate(([0], np.cumsum(self.counts)[:-1])).astype(np.int64)

    def sorted_indices(self, mask: np.ndarray) -> np.ndarray:
        """Ascending sorted indices of the positions where `mask` is true."""
        return np.flatnonzero(mask[self.order])

    def positions(self, sorted_indices: np.ndarray) -> np.ndarray:
        return self.order[sorted_indices]
