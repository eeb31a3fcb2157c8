"""PULSESync's per-weight passes, compiled: one walk over a tensor each way, no per-weight memory.

A tensor's stream is read in the order a walker meets the changes. For each context class with
changes, its first rank (a gap from -1) comes first, classes ascending; then, for each change
in natural position order, its value symbol and, if the class has more changes, the gap to
the class's next change. The decoder therefore needs, per class, only a counter, the next
wanted rank and how many changes are left: it reads the old weights once, writes the new ones
once, and decodes symbols exactly when it meets them. The encoder collects (class, rank, value)
per change in one pass, then codes them backwards (ANS is a stack).

Classes whose every position changed (code FULL) have no gaps: each member is the next change.

Values: z = zigzag(new - old) - 1 on the bit patterns (wrapping at the dtype's width). z < 16 is
its own symbol; larger z is sent as 16 + bit length - 5 plus the bits below its leading one.
"""

from __future__ import annotations

import numba
import numpy as np

from protocol.ans import OK, PRECISION, STATE_LOW, dec_bits, dec_cat, enc_put
from protocol.contexts import NUM_CONTEXTS
from protocol.positions import dec_gap, enc_gap

LITERALS = 16
ALPHABET = LITERALS + 33 - 5  # literal z 0..15, then bit lengths 5..32
_jit = numba.njit(nogil=True, cache=True)
_inline = numba.njit(nogil=True, cache=True, inline="always")


@_inline
def _bit_length(z: int) -> int:
    n = 0
    while z:
        z >>= 1
        n += 1
    return n


@_inline
def value_symbol(z: int) -> int:
    return z if z < LITERALS else LITERALS + _bit_length(z) - 5


@_inline
def _z_of(a: int, b: int, width: int) -> int:
    d = (b - a) & ((1 << width) - 1)
    if d >= 1 << (width - 1):
        d -= 1 << width
    return (-2 * d - 1 if d < 0 else 2 * d) - 1


@_inline
def _apply_z(a: int, z: int, width: int) -> int:
    zig = z + 1
    d = -((zig + 1) >> 1) if zig & 1 else zig >> 1
    return (a + d) & ((1 << width) - 1)


# -- encoding ---------------------------------------------------------------------------------


@_jit
def collect(
    old: np.ndarray, new: np.ndarray, shift: int, emask: int, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(class, rank, z) of every change in natural order, and every class's size."""
    cnt = np.zeros(NUM_CONTEXTS, np.int64)
    cap = max(1024, len(old) >> 6)
    cls = np.empty(cap, np.uint8)
    rank = np.empty(cap, np.int64)
    zs = np.empty(cap, np.int64)
    k = 0
    for i in range(len(old)):
        a = old[i]
        c = (a >> shift) & emask
        r = cnt[c]
        cnt[c] = r + 1
        b = new[i]
        if a != b:
            if k == cap:  # grow by doubling: amortized linear, peak 1.5x the final size
                cap *= 2
                cls2, rank2, zs2 = np.empty(cap, np.uint8), np.empty(cap, np.int64), np.empty(cap, np.int64)
                cls2[:k], rank2[:k], zs2[:k] = cls[:k], rank[:k], zs[:k]
                cls, rank, zs = cls2, rank2, zs2
            cls[k], rank[k], zs[k] = c, r, _z_of(np.int64(a), np.int64(b), width)
            k += 1
    return cls[:k].copy(), rank[:k].copy(), zs[:k].copy(), cnt


@_jit
def next_gaps(cls: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per change: the gap to its class's next change (-1 if last); per class: its first rank (-1
    if none) and its number of changes."""
    k = len(cls)
    nxt = np.full(k, -1, np.int64)
    last = np.full(NUM_CONTEXTS, -1, np.int64)
    for j in range(k - 1, -1, -1):
        c = cls[j]
        if last[c] >= 0:
            nxt[j] = rank[last[c]] - rank[j] - 1
        last[c] = j
    first = np.full(NUM_CONTEXTS, -1, np.int64)
    for c in range(NUM_CONTEXTS):
        if last[c] >= 0:
            first[c] = rank[last[c]]
    count = np.zeros(NUM_CONTEXTS, np.int64)
    for j in range(k):
        count[cls[j]] += 1
    return nxt, first, count


@_jit
def symbol_histogram(cls: np.ndarray, zs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(classes x ALPHABET) value symbol counts, and the extra bits the large z carry in total."""
    hist = np.zeros((NUM_CONTEXTS, ALPHABET), np.int64)
    extra = np.zeros(NUM_CONTEXTS, np.int64)
    for j in range(len(cls)):
        s = value_symbol(zs[j])
        hist[cls[j], s] += 1
        if s >= LITERALS:
            extra[cls[j]] += s - LITERALS + 4
    return hist, extra


@_inline
def _enc_value(x: int, out: np.ndarray, pos: int, z: int, row: int, freq: np.ndarray, cum: np.ndarray) -> tuple[int, int]:
    s = value_symbol(z)
    if s >= LITERALS:
        nb = s - LITERALS + 4
        extra = z - (1 << nb)
        if nb > 16:
            x, pos = enc_put(x, out, pos, 1, extra & 0xFFFF, 16)
            x, pos = enc_put(x, out, pos, 1, extra >> 16, nb - 16)
        else:
            x, pos = enc_put(x, out, pos, 1, extra, nb)
    return enc_put(x, out, pos, freq[row, s], cum[row, s], PRECISION)


@_jit
def encode_stream(
    cls: np.ndarray,
    zs: np.ndarray,
    nxt: np.ndarray,
    first: np.ndarray,
    code_b: np.ndarray,
    code_t: np.ndarray,
    row: np.ndarray,
    freq: np.ndarray,
    cum: np.ndarray,
) -> np.ndarray:
    """The tensor's words (uint16), in the walker's decode order (see the module docstring)."""
    # one word at most per push: a change is at most 8 pushes (value, 2 extra; gap, 2 escape,
    # 2 remainder... and its symbol), a first gap 5, and the final state 2
    out = np.empty(8 * len(cls) + 5 * NUM_CONTEXTS + 2, np.uint16)
    x, pos = STATE_LOW, len(out)
    for j in range(len(cls) - 1, -1, -1):
        c = cls[j]
        if nxt[j] >= 0 and code_t[c] >= 0:
            x, pos = enc_gap(x, out, pos, nxt[j], code_b[c], code_t[c])
        x, pos = _enc_value(x, out, pos, zs[j], row[c], freq, cum)
    for c in range(NUM_CONTEXTS - 1, -1, -1):
        if first[c] >= 0 and code_t[c] >= 0:
            x, pos = enc_gap(x, out, pos, first[c], code_b[c], code_t[c])
    pos -= 2
    out[pos], out[pos + 1] = x >> 16, x & 0xFFFF
    return out[pos:].copy()


# -- decoding ---------------------------------------------------------------------------------


@_jit
def start_walk(
    words: np.ndarray, left: np.ndarray, code_b: np.ndarray, code_t: np.ndarray, state: np.ndarray, nxt: np.ndarray
) -> int:
    """Decode each active class's first rank into nxt; state = [x, pos] of the stream."""
    x, pos = state[0], state[1]
    for c in range(NUM_CONTEXTS):
        nxt[c] = -1
        if left[c] > 0:
            if code_t[c] < 0:
                nxt[c] = 0
            else:
                x, pos, g, status = dec_gap(x, pos, words, code_b[c], code_t[c])
                if status != OK:
                    return status
                nxt[c] = g
    state[0], state[1] = x, pos
    return OK


@_jit
def walk(
    old: np.ndarray,
    new: np.ndarray,
    shift: int,
    emask: int,
    width: int,
    words: np.ndarray,
    state: np.ndarray,
    cnt: np.ndarray,
    nxt: np.ndarray,
    left: np.ndarray,
    code_b: np.ndarray,
    code_t: np.ndarray,
    row: np.ndarray,
    vsym: np.ndarray,
    vfreq: np.ndarray,
    vcum: np.ndarray,
) -> int:
    """new = old with the stream's changes, for one slab of a tensor; per-class state carries over."""
    x, pos = state[0], state[1]
    for i in range(len(old)):
        a = old[i]
        c = (a >> shift) & emask
        r = cnt[c]
        cnt[c] = r + 1
        if r == nxt[c]:
            x, pos, s, status = dec_cat(x, pos, words, row[c], vsym, vfreq, vcum)
            z = s
            if s >= LITERALS and status == OK:
                nb = s - LITERALS + 4
                lo = 0
                if nb > 16:
                    x, pos, hi, status = dec_bits(x, pos, words, nb - 16)
                    if status == OK:
                        x, pos, lo, status = dec_bits(x, pos, words, 16)
                    extra = (hi << 16) | lo
                else:
                    x, pos, extra, status = dec_bits(x, pos, words, nb)
                z = (1 << nb) | extra
            if status != OK:
                return status
            a = _apply_z(np.int64(a), z, width)
            rest = left[c] - 1
            left[c] = rest
            if rest == 0:
                nxt[c] = -1
            elif code_t[c] < 0:
                nxt[c] = r + 1
            else:
                x, pos, g, status = dec_gap(x, pos, words, code_b[c], code_t[c])
                if status != OK:
                    return status
                nxt[c] = r + 1 + g
        new[i] = a
    state[0], state[1] = x, pos
    return OK

