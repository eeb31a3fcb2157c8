"""What the receiver already knows about each weight: its exponent, and the ranks it induces.

A BF16 weight changes only when an update exceeds about half its ulp, and the ulp is set by the
exponent, so the old weight's exponent predicts both whether a weight changes and by how much.
Both ends compute the same context from the *old* state, so it costs no bits on the wire.

Positions are coded as ranks inside their context class: the rank of position i is the number of
positions before i with the same context. Both directions are one compiled pass in natural order
with one counter per context (no sort, no per-weight memory): `marked_ranks` gives the class and
rank of each marked position, `locate` turns per-class ranks back into positions.
"""

from __future__ import annotations

import numba
import numpy as np

from protocol.errors import InvalidPositions, MalformedPayload

# dtype wire name -> (exponent shift, exponent mask)
EXPONENT = {"bfloat16": (7, 0xFF), "float16": (10, 0x1F), "float32": (23, 0xFF)}
NUM_CONTEXTS = 256

_jit = numba.njit(nogil=True, cache=True)


def exponent_context(raw: np.ndarray, dtype: str) -> np.ndarray:
    """(n,) uint8 exponent field of each bit pattern in `raw` (uint16 or uint32)."""
    shift, mask = EXPONENT[dtype]
    return ((raw >> shift) & mask).astype(np.uint8)


@_jit
def _marked_ranks(
    raw: np.ndarray, mask: np.ndarray, shift: int, emask: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    cnt = np.zeros(NUM_CONTEXTS, np.int64)
    total = 0
    for i in range(len(mask)):
        total += mask[i]
    pos = np.empty(total, np.int64)
    cls = np.empty(total, np.int64)
    rank = np.empty(total, np.int64)
    j = 0
    for i in range(len(raw)):
        c = (raw[i] >> shift) & emask
        r = cnt[c]
        cnt[c] = r + 1
        if mask[i]:
            pos[j], cls[j], rank[j] = i, c, r
            j += 1
    return pos, cls, rank, cnt


def marked_ranks(
    raw: np.ndarray, mask: np.ndarray, dtype: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(position, class, rank) of each marked position in natural order, and every class's size."""
    shift, emask = EXPONENT[dtype]
    return _marked_ranks(raw, mask.view(np.uint8), shift, emask)


@_jit
def _locate(
    raw: np.ndarray, shift: int, emask: int, start: np.ndarray, k: np.ndarray, ranks: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cnt = np.zeros(NUM_CONTEXTS, np.int64)
    done = np.zeros(NUM_CONTEXTS, np.int64)
    nxt = np.full(NUM_CONTEXTS, -1, np.int64)
    for c in range(NUM_CONTEXTS):
        if k[c] > 0:
            nxt[c] = ranks[start[c]]
    out = np.empty(len(ranks), np.int64)
    for i in range(len(raw)):
        c = (raw[i] >> shift) & emask
        r = cnt[c]
        cnt[c] = r + 1
        if r == nxt[c]:
            d = done[c]
            out[start[c] + d] = i
            d += 1
            done[c] = d
            nxt[c] = ranks[start[c] + d] if d < k[c] else -1
    return out, cnt, done


def locate(
    raw: np.ndarray, dtype: str, classes: np.ndarray, k: np.ndarray, ranks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Positions (class-major, as `ranks`) of the given ranks, strictly ascending within each
    class; and every class's size. Raises InvalidPositions if a rank is past its class."""
    shift, emask = EXPONENT[dtype]
    per_class = np.zeros(NUM_CONTEXTS, np.int64)
    per_class[classes] = k
    start = np.concatenate(([0], np.cumsum(per_class)[:-1])).astype(np.int64)
    out, counts, done = _locate(raw, shift, emask, start, per_class, np.ascontiguousarray(ranks, np.int64))
    if np.any(done != per_class):
        raise InvalidPositions("a rank is past the end of its exponent class")
    return out, counts


def check_full_classes(name: str, classes: np.ndarray, k: np.ndarray, full: np.ndarray, counts: np.ndarray) -> None:
    """A class coded as fully marked must be exactly that; any other must not be (canonical form)."""
    whole = k == counts[classes]
    if np.any(whole != full):
        raise MalformedPayload(f"{name}: the fully-marked flag disagrees with the exponent class sizes")
