"""What the receiver already knows about each weight: its exponent, and the ranks it induces.

A BF16 weight changes only when an update exceeds about half its ulp, and the ulp is set by the
exponent, so the old weight's exponent predicts both whether a weight changes and by how much.
Both ends compute the same context from the *old* state, so it costs no bits on the wire.

Positions are coded as ranks inside their context class: the rank of position i is the number of
positions before i with the same context. Both directions are compiled passes in natural order
with one counter per context (no sort, no per-weight memory): `take_class_major` gives the
class-major gaps and values of the marked positions (PULSELoCo's encoder), `place` writes
class-major values back at their positions (its decoder); PULSESync's walks are in syncpass.py.
"""

from __future__ import annotations

import numba
import numpy as np

from protocol.errors import MalformedPayload

# dtype wire name -> (exponent shift, exponent mask)
EXPONENT = {"bfloat16": (7, 0xFF), "float16": (10, 0x1F), "float32": (23, 0xFF)}
NUM_CONTEXTS = 256

_jit = numba.njit(nogil=True, cache=True)


@_jit
def class_counts(raw: np.ndarray, mask: np.ndarray, shift: int, emask: int) -> tuple[np.ndarray, np.ndarray]:
    """Every class's size and its number of marked positions."""
    n = np.zeros(NUM_CONTEXTS, np.int64)
    k = np.zeros(NUM_CONTEXTS, np.int64)
    for i in range(len(raw)):
        c = (raw[i] >> shift) & emask
        n[c] += 1
        k[c] += mask[i]
    return n, k


@_jit
def take_class_major(
    raw: np.ndarray,
    mask: np.ndarray,
    s: np.ndarray,
    shift: int,
    emask: int,
    k: np.ndarray,
    bf16: bool,
    offsets: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Class-major (gap from the class's previous marked rank, value) of the marked positions,
    taking each value out of `s` (in place: s keeps the rest); bf16: values rounded to BF16.
    `offsets`: an empty array whose dtype the gaps take."""
    start = np.zeros(NUM_CONTEXTS, np.int64)
    for c in range(1, NUM_CONTEXTS):
        start[c] = start[c - 1] + k[c - 1]
    total = start[NUM_CONTEXTS - 1] + k[NUM_CONTEXTS - 1]
    gaps = np.empty(total, offsets.dtype)
    values = np.empty(total, np.float32)
    value_bits = values.view(np.uint32)
    cnt = np.zeros(NUM_CONTEXTS, np.int64)
    last = np.full(NUM_CONTEXTS, -1, np.int64)
    bits = s.view(np.uint32)
    for i in range(len(raw)):
        c = (raw[i] >> shift) & emask
        r = cnt[c]
        cnt[c] = r + 1
        if mask[i]:
            slot = start[c]
            start[c] = slot + 1
            gaps[slot] = r - last[c] - 1
            last[c] = r
            if bf16:  # round to nearest even at 8 significant bits, as torch's cast does (finite s)
                u = np.int64(bits[i])
                value_bits[slot] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            else:
                values[slot] = s[i]
            s[i] = s[i] - values[slot]
    return gaps, values


@_jit
def place(
    raw: np.ndarray, shift: int, emask: int, k: np.ndarray, gaps: np.ndarray, values: np.ndarray, out: np.ndarray
) -> tuple[np.ndarray, bool]:
    """out[position] = value for class-major (gap, value) pairs of k[c] per class, walking the
    weights once; every class's size, and False if a rank falls past its class."""
    start = np.zeros(NUM_CONTEXTS, np.int64)
    for c in range(1, NUM_CONTEXTS):
        start[c] = start[c - 1] + k[c - 1]
    done = np.zeros(NUM_CONTEXTS, np.int64)
    nxt = np.full(NUM_CONTEXTS, -1, np.int64)
    for c in range(NUM_CONTEXTS):
        if k[c] > 0:
            nxt[c] = gaps[start[c]]
    cnt = np.zeros(NUM_CONTEXTS, np.int64)
    for i in range(len(raw)):
        c = (raw[i] >> shift) & emask
        r = cnt[c]
        cnt[c] = r + 1
        if r == nxt[c]:
            d = done[c]
            out[i] = values[start[c] + d]
            d += 1
            done[c] = d
            nxt[c] = r + 1 + gaps[start[c] + d] if d < k[c] else -1
    for c in range(NUM_CONTEXTS):
        if done[c] != k[c]:
            return cnt, False
    return cnt, True


def check_full_classes(name: str, classes: np.ndarray, k: np.ndarray, full: np.ndarray, counts: np.ndarray) -> None:
    """A class coded as fully marked must be exactly that; any other must not be (canonical form)."""
    whole = k == counts[classes]
    if np.any(whole != full):
        raise MalformedPayload(f"{name}: the fully-marked flag disagrees with the exponent class sizes")
