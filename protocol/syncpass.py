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

from protocol.ans import OK, PAST_END, PRECISION, STATE_LOW, TOTAL, enc_put
from protocol.contexts import NUM_CONTEXTS
from protocol.positions import GEOMETRIC_CUM, GEOMETRIC_FREQ, GEOMETRIC_SYM, Q_ESCAPE, dec_gap, enc_gap

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
def _collect_into(
    old: np.ndarray,
    new: np.ndarray,
    start: int,
    shift: int,
    emask: int,
    width: int,
    cnt: np.ndarray,
    cls: np.ndarray,
    rank: np.ndarray,
    zs: np.ndarray,
    k: int,
) -> tuple[int, int]:
    """Walk from `start` until the end or until the output arrays are full: (next i, changes)."""
    cap = len(cls)
    for i in range(start, len(old)):
        a = old[i]
        c = (a >> shift) & emask
        r = cnt[c]
        cnt[c] = r + 1
        b = new[i]
        if a != b:
            cls[k], rank[k], zs[k] = c, r, _z_of(np.int64(a), np.int64(b), width)
            k += 1
            if k == cap:
                return i + 1, k
    return len(old), k


@_jit
def collect(
    old: np.ndarray, new: np.ndarray, shift: int, emask: int, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(class, rank, z) of every change in natural order, and every class's size."""
    cnt = np.zeros(NUM_CONTEXTS, np.int64)
    cap = max(1024, len(old) >> 6)
    cls, rank, zs = np.empty(cap, np.uint8), np.empty(cap, np.int64), np.empty(cap, np.int64)
    i, k = _collect_into(old, new, 0, shift, emask, width, cnt, cls, rank, zs, 0)
    while i < len(old):  # full: grow by doubling (amortized linear, peak 1.5x the final size)
        cap *= 2
        cls2, rank2, zs2 = np.empty(cap, np.uint8), np.empty(cap, np.int64), np.empty(cap, np.int64)
        cls2[:k], rank2[:k], zs2[:k] = cls[:k], rank[:k], zs[:k]
        cls, rank, zs = cls2, rank2, zs2
        i, k = _collect_into(old, new, i, shift, emask, width, cnt, cls, rank, zs, k)
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


@_inline
def _push_bits(x: int, out: np.ndarray, pos: int, v: int, nbits: int) -> tuple[int, int]:
    """Push a raw field of up to 32 bits (decode order: its high piece, then 16 bits at most)."""
    lo_bits = nbits if nbits <= 16 else 16
    hi_bits = nbits - lo_bits
    if lo_bits > 0:
        if x >= np.int64(1) << (32 - lo_bits):
            pos -= 1
            out[pos] = x & 0xFFFF
            x >>= 16
        x = (x << lo_bits) | (v & ((1 << lo_bits) - 1))
    if hi_bits > 0:
        if x >= np.int64(1) << (32 - hi_bits):
            pos -= 1
            out[pos] = x & 0xFFFF
            x >>= 16
        x = (x << hi_bits) | (v >> lo_bits)
    return x, pos


@_inline
def _push_symbol(x: int, out: np.ndarray, pos: int, f: int, c: int) -> tuple[int, int]:
    if x >= f << (32 - PRECISION):
        pos -= 1
        out[pos] = x & 0xFFFF
        x >>= 16
    q = x // f
    return (q << PRECISION) + (x - q * f) + c, pos


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
    """The tensor's words (uint16), in the walker's decode order (see the module docstring).

    Pushed backwards: per change from the last, its gap to the class's next change (remainder
    bits, escape bits, q symbol) and then its value (extra bits, symbol); then the first gaps.
    """
    # one word at most per push: a change is at most 8 pushes, a first gap 5, the final state 2
    out = np.empty(8 * len(cls) + 5 * NUM_CONTEXTS + 2, np.uint16)
    x, pos = np.int64(STATE_LOW), len(out)
    gfreq, gcum = GEOMETRIC_FREQ, GEOMETRIC_CUM
    for j in range(len(cls) - 1, -NUM_CONTEXTS - 1, -1):
        if j < 0:  # the first gaps, pushed last (read first), classes ascending when read
            c = j + NUM_CONTEXTS
            if first[c] < 0 or code_t[c] < 0:
                continue
            gap = first[c]
        else:
            c = cls[j]
            gap = nxt[j] if code_t[c] >= 0 else -1
        if gap >= 0:
            b, t = code_b[c], code_t[c]
            x, pos = _push_bits(x, out, pos, gap & ((np.int64(1) << b) - 1), b)
            q = gap >> b
            if q >= Q_ESCAPE:
                x, pos = _push_bits(x, out, pos, q - Q_ESCAPE, 32)
                q = Q_ESCAPE
            x, pos = _push_symbol(x, out, pos, gfreq[t, q], gcum[t, q])
        if j < 0:
            continue
        z, m = zs[j], row[c]
        sym = z
        if z >= LITERALS:
            nb = _bit_length(z) - 1
            x, pos = _push_bits(x, out, pos, z - (np.int64(1) << nb), nb)
            sym = LITERALS + nb - 4
        x, pos = _push_symbol(x, out, pos, freq[m, sym], cum[m, sym])
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
    """new = old with the stream's changes, for one slab of a tensor; per-class state carries over.

    The rANS steps are written out here rather than called (ans.dec_cat, positions.dec_gap do
    the same): numba's calls in this loop cost as much as the decoding itself.
    """
    x, pos, n_words = state[0], state[1], len(words)
    gsym, gfreq, gcum = GEOMETRIC_SYM, GEOMETRIC_FREQ, GEOMETRIC_CUM
    wmask = (1 << width) - 1
    for i in range(len(old)):
        a = np.int64(old[i])
        c = (a >> shift) & emask
        r = cnt[c]
        cnt[c] = r + 1
        if r == nxt[c]:
            # value: a symbol of the class's model, then the bits below a large z's leading one
            m = row[c]
            slot = x & (TOTAL - 1)
            z = np.int64(vsym[m, slot])
            x = vfreq[m, z] * (x >> PRECISION) + slot - vcum[m, z]
            if x < STATE_LOW:
                if pos == n_words:
                    return PAST_END
                x = (x << 16) | np.int64(words[pos])
                pos += 1
            if z >= LITERALS:  # the nb bits below z's leading one: a high piece, then 16 at most
                nb = z - LITERALS + 4
                hi_bits = nb - 16 if nb > 16 else 0
                lo_bits = nb - hi_bits
                extra = x & ((1 << hi_bits) - 1)
                x >>= hi_bits
                if x < STATE_LOW:
                    if pos == n_words:
                        return PAST_END
                    x = (x << 16) | np.int64(words[pos])
                    pos += 1
                extra = (extra << lo_bits) | (x & ((1 << lo_bits) - 1))
                x >>= lo_bits
                if x < STATE_LOW:
                    if pos == n_words:
                        return PAST_END
                    x = (x << 16) | np.int64(words[pos])
                    pos += 1
                z = (np.int64(1) << nb) | extra
            zig = z + 1
            d = -((zig + 1) >> 1) if zig & 1 else zig >> 1
            a = (a + d) & wmask
            rest = left[c] - 1
            left[c] = rest
            t = code_t[c]
            if rest == 0:
                nxt[c] = -1
            elif t < 0:
                nxt[c] = r + 1
            else:
                # gap: a geometric symbol q (64 escapes to 32 raw bits), then b raw bits
                slot = x & (TOTAL - 1)
                q = np.int64(gsym[t, slot])
                x = gfreq[t, q] * (x >> PRECISION) + slot - gcum[t, q]
                if x < STATE_LOW:
                    if pos == n_words:
                        return PAST_END
                    x = (x << 16) | np.int64(words[pos])
                    pos += 1
                if q == Q_ESCAPE:  # 32 raw bits: high 16, then low 16
                    e = x & 0xFFFF
                    x >>= 16
                    if x < STATE_LOW:
                        if pos == n_words:
                            return PAST_END
                        x = (x << 16) | np.int64(words[pos])
                        pos += 1
                    e = (e << 16) | (x & 0xFFFF)
                    x >>= 16
                    if x < STATE_LOW:
                        if pos == n_words:
                            return PAST_END
                        x = (x << 16) | np.int64(words[pos])
                        pos += 1
                    q += e
                b = code_b[c]  # the remainder's b bits: a high piece, then 16 at most
                hi_bits = b - 16 if b > 16 else 0
                lo_bits = b - hi_bits
                g = (q << hi_bits) | (x & ((1 << hi_bits) - 1))
                x >>= hi_bits
                if x < STATE_LOW:
                    if pos == n_words:
                        return PAST_END
                    x = (x << 16) | np.int64(words[pos])
                    pos += 1
                g = (g << lo_bits) | (x & ((1 << lo_bits) - 1))
                x >>= lo_bits
                if x < STATE_LOW:
                    if pos == n_words:
                        return PAST_END
                    x = (x << 16) | np.int64(words[pos])
                    pos += 1
                nxt[c] = r + 1 + g
        new[i] = a
    state[0], state[1] = x, pos
    return OK
