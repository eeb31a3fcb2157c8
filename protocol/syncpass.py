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

from protocol.ans import OK, PAST_END, PRECISION, STATE_LOW, TOTAL
from protocol.contexts import NUM_CONTEXTS
from protocol.positions import GEOMETRIC_CUM, GEOMETRIC_FREQ, GEOMETRIC_PACKED, Q_ESCAPE, dec_gap

LITERALS = 16
ALPHABET = LITERALS + 33 - 5  # literal z 0..15, then bit lengths 5..32
_SAMPLE = 64
AHEAD = 1 << 62  # a decoding walk's countdown for a class with no change left: never reaches 0
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


# -- encoding ---------------------------------------------------------------------------------


@_inline
def _take(
    a: int, b: int, c: int, r: int, width: int, last: np.ndarray, hist: np.ndarray,
    cls: np.ndarray, gap: np.ndarray, zs: np.ndarray, k: int,
) -> None:  # fmt: skip
    """Record change k: class c, rank r in it, value z of old a to new b."""
    z = _z_of(a, b, width)
    cls[k], gap[k], zs[k] = c, r - last[c] - 1, z
    last[c] = r
    hist[c, z if z < LITERALS else LITERALS + _bit_length(z) - 5] += 1


@_jit
def _collect_into(
    old: np.ndarray,
    new: np.ndarray,
    start: int,
    shift: int,
    emask: int,
    width: int,
    lanes: np.ndarray,
    last: np.ndarray,
    hist: np.ndarray,
    cls: np.ndarray,
    gap: np.ndarray,
    zs: np.ndarray,
    k: int,
) -> tuple[int, int]:
    """Walk from `start` until the end or until the output arrays are nearly full: (next i, changes).

    Per change: its class, the gap from its class's previous change (ranks; the first counts from
    -1), its z; per class: its last changed rank, its value symbols (hist). Class sizes are
    counted in 4 lanes (lanes[j] counts the weights at i % 4 == j of each group of 4), so that
    consecutive weights of one class do not wait on each other's counter; a weight's rank is the
    sum of the lanes, needed only where it changed."""
    cap = len(cls) - 4
    i = start
    end4 = start + (len(old) - start) // 4 * 4
    while i < end4:
        if k > cap:
            return i, k
        a0, a1, a2, a3 = old[i], old[i + 1], old[i + 2], old[i + 3]
        if a0 == new[i] and a1 == new[i + 1] and a2 == new[i + 2] and a3 == new[i + 3]:
            lanes[0, (a0 >> shift) & emask] += 1
            lanes[1, (a1 >> shift) & emask] += 1
            lanes[2, (a2 >> shift) & emask] += 1
            lanes[3, (a3 >> shift) & emask] += 1
        else:
            for j in range(4):
                a = old[i + j]
                c = (a >> shift) & emask
                b = new[i + j]
                if a != b:
                    r = lanes[0, c] + lanes[1, c] + lanes[2, c] + lanes[3, c]
                    _take(int(a), int(b), c, r, width, last, hist, cls, gap, zs, k)
                    k += 1
                lanes[j, c] += 1
        i += 4
    for i in range(end4, len(old)):  # the last few, lane 0
        if k > cap:
            return i, k
        a = old[i]
        c = (a >> shift) & emask
        b = new[i]
        if a != b:
            r = lanes[0, c] + lanes[1, c] + lanes[2, c] + lanes[3, c]
            _take(int(a), int(b), c, r, width, last, hist, cls, gap, zs, k)
            k += 1
        lanes[0, c] += 1
    return len(old), k


@_jit
def collect(
    old: np.ndarray,
    new: np.ndarray,
    shift: int,
    emask: int,
    width: int,
    offsets: np.ndarray,
    cnt: np.ndarray,
    last: np.ndarray,
    hist: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class, gap from the class's previous change, z) of every change in natural order.

    Per class, `cnt` (its size so far), `last` (its last changed rank, -1 at first) and `hist`
    (classes x ALPHABET value symbols) carry over, so a tensor may be walked slab by slab.
    `offsets`: an empty array whose dtype the gaps take (int32 for tensors below 2**31 weights):
    with the class byte and a z of the weights' width, 7 bytes a change for BF16."""
    sampled = 0  # size the arrays from every 64th weight, so that they rarely grow or waste
    for i in range(0, len(old), _SAMPLE):
        sampled += old[i] != new[i]
    cap = 1024 + sampled * _SAMPLE * 5 // 4
    cls, gap, zs = np.empty(cap, np.uint8), np.empty(cap, offsets.dtype), np.empty(cap, old.dtype)
    lanes = np.zeros((4, len(cnt)), np.int64)
    lanes[0] = cnt
    i, k = _collect_into(old, new, 0, shift, emask, width, lanes, last, hist, cls, gap, zs, 0)
    while i < len(old):  # full after all: grow by half (amortized linear)
        cap += cap // 2
        cls2, gap2, zs2 = np.empty(cap, np.uint8), np.empty(cap, offsets.dtype), np.empty(cap, old.dtype)
        cls2[:k], gap2[:k], zs2[:k] = cls[:k], gap[:k], zs[:k]
        cls, gap, zs = cls2, gap2, zs2
        i, k = _collect_into(old, new, i, shift, emask, width, lanes, last, hist, cls, gap, zs, k)
    cnt[:] = lanes.sum(axis=0)
    if 5 * k >= 4 * cap:  # little unused: keep the arrays rather than hold both while copying
        return cls[:k], gap[:k], zs[:k]
    return cls[:k].copy(), gap[:k].copy(), zs[:k].copy()


def value_histogram(cls: np.ndarray, zs: np.ndarray) -> np.ndarray:
    """(classes x ALPHABET) counts of the value symbols of changes with classes `cls`, values `zs`
    (what `collect` accumulates, for changes collected elsewhere)."""
    z = zs.astype(np.int64)
    length = np.zeros_like(z)
    big = z >= LITERALS
    length[big] = np.floor(np.log2(z[big].astype(np.float64))).astype(np.int64) + 1  # exact below 2**52
    sym = np.where(big, LITERALS + length - 5, z)
    keys = cls.astype(np.int64) * ALPHABET + sym
    return np.bincount(keys, minlength=NUM_CONTEXTS * ALPHABET).reshape(NUM_CONTEXTS, ALPHABET)


def extra_bits(hist: np.ndarray) -> np.ndarray:
    """Per class, the raw bits its large z carry: symbol s >= LITERALS carries s - LITERALS + 4."""
    per_symbol = np.maximum(np.arange(ALPHABET) - LITERALS + 4, 0)
    return hist @ per_symbol


@_jit
def encode_stream(
    cls: np.ndarray,
    gap: np.ndarray,
    zs: np.ndarray,
    code_b: np.ndarray,
    code_t: np.ndarray,
    row: np.ndarray,
    freq: np.ndarray,
    cum: np.ndarray,
) -> np.ndarray:
    """The tensor's words (uint16), in the walker's decode order (see the module docstring).

    Pushed backwards: per change from the last, the gap to its class's next change (that change's
    gap from it: remainder bits, escape bits, q symbol), then its value (extra bits, symbol);
    then what remains pending, each class's first gap. Every push is the same three lines
    (renormalize: emit 16 bits if the state would overflow; then code), written out rather than
    called: numba's calls in this loop cost more than the coding.
    """
    # one word at most per push: a change is at most 8 pushes, a first gap 5, the final state 2
    out = np.empty(8 * len(cls) + 5 * NUM_CONTEXTS + 2, np.uint16)
    x, pos = np.int64(STATE_LOW), len(out)
    gfreq, gcum = GEOMETRIC_FREQ, GEOMETRIC_CUM
    pending = np.full(NUM_CONTEXTS, -1, np.int64)
    for j in range(len(cls) - 1, -NUM_CONTEXTS - 1, -1):
        c = j + NUM_CONTEXTS if j < 0 else np.int64(cls[j])  # j < 0: the first gaps, classes descending
        g, t = pending[c], code_t[c]
        if g >= 0 and t >= 0:
            b = code_b[c]
            q = g >> b
            lo = b if b <= 16 else 16  # the remainder's b bits: low 16 pushed first, read last
            if lo > 0:
                if x >= np.int64(1) << (32 - lo):
                    pos -= 1
                    out[pos] = x & 0xFFFF
                    x >>= 16
                x = (x << lo) | (g & ((np.int64(1) << lo) - 1))
            if b > 16:
                if x >= np.int64(1) << (32 - (b - 16)):
                    pos -= 1
                    out[pos] = x & 0xFFFF
                    x >>= 16
                x = (x << (b - 16)) | ((g >> 16) & ((np.int64(1) << (b - 16)) - 1))
            if q >= Q_ESCAPE:  # 32 raw bits of q - 64: low 16 pushed first
                e = q - Q_ESCAPE
                for piece in (e & 0xFFFF, e >> 16):
                    if x >= np.int64(1) << 16:
                        pos -= 1
                        out[pos] = x & 0xFFFF
                        x >>= 16
                    x = (x << 16) | piece
                q = Q_ESCAPE
            f = gfreq[t, q]
            if x >= f << (32 - PRECISION):
                pos -= 1
                out[pos] = x & 0xFFFF
                x >>= 16
            d = x // f
            x = (d << PRECISION) + (x - d * f) + gcum[t, q]
        if j < 0:
            continue
        pending[c] = gap[j]
        z, m = int(zs[j]), row[c]
        sym = z
        if z >= LITERALS:  # the bits below z's leading one: low 16 pushed first
            nb = _bit_length(z) - 1
            extra = z - (np.int64(1) << nb)
            sym = LITERALS + nb - 4
            lo = nb if nb <= 16 else 16
            if x >= np.int64(1) << (32 - lo):
                pos -= 1
                out[pos] = x & 0xFFFF
                x >>= 16
            x = (x << lo) | (extra & ((np.int64(1) << lo) - 1))
            if nb > 16:
                if x >= np.int64(1) << (32 - (nb - 16)):
                    pos -= 1
                    out[pos] = x & 0xFFFF
                    x >>= 16
                x = (x << (nb - 16)) | (extra >> 16)
        f = freq[m, sym]
        if x >= f << (32 - PRECISION):
            pos -= 1
            out[pos] = x & 0xFFFF
            x >>= 16
        d = x // f
        x = (d << PRECISION) + (x - d * f) + cum[m, sym]
    pos -= 2
    out[pos], out[pos + 1] = x >> 16, x & 0xFFFF
    return out[pos:].copy()


# -- decoding ---------------------------------------------------------------------------------


@_jit
def start_walk(
    words: np.ndarray,
    left: np.ndarray,
    code_b: np.ndarray,
    code_t: np.ndarray,
    state: np.ndarray,
    nxt: np.ndarray,
    rem: np.ndarray,
) -> int:
    """Decode each active class's first rank into nxt, and as rem the members to pass before it
    (AHEAD for a class without changes); state = [x, pos] of the stream."""
    x, pos = state[0], state[1]
    for c in range(NUM_CONTEXTS):
        nxt[c], rem[c] = -1, AHEAD
        if left[c] > 0:
            if code_t[c] < 0:
                nxt[c] = rem[c] = 0
            else:
                x, pos, g, status = dec_gap(x, pos, words, code_b[c], code_t[c])
                if status != OK:
                    return status
                nxt[c] = rem[c] = g
    state[0], state[1] = x, pos
    return OK


def class_sizes(nxt: np.ndarray, rem: np.ndarray) -> np.ndarray:
    """Each class's size after a whole tensor's walk, for classes whose changes were all found:
    the last changed rank (nxt; -1 with none), one, and the members met since (AHEAD - rem)."""
    return nxt + 1 + (AHEAD - rem)


@_jit
def walk(
    old: np.ndarray,
    new: np.ndarray,
    shift: int,
    emask: int,
    width: int,
    words: np.ndarray,
    state: np.ndarray,
    nxt: np.ndarray,
    rem: np.ndarray,
    left: np.ndarray,
    code_b: np.ndarray,
    code_t: np.ndarray,
    row: np.ndarray,
    vpacked: np.ndarray,
) -> int:
    """new = old with the stream's changes, for one slab of a tensor; per-class state carries over.

    Per class, nxt is the rank of its next change (its last one once all are found) and rem how
    many members to pass before it: a weight costs one counter, read, compared and written, and
    only a change touches the rest (`class_sizes` gives the counts the end checks need).

    The rANS steps are written out here rather than called (ans.dec_cat, positions.dec_gap do
    the same): numba's calls in this loop cost as much as the decoding itself.
    """
    x, pos, n_words = state[0], state[1], len(words)
    gpacked = GEOMETRIC_PACKED
    wmask = (1 << width) - 1
    new[:] = old  # one vectorized copy; the loop then writes only the changed weights
    for i in range(len(old)):
        a = np.int64(old[i])
        c = (a >> shift) & emask
        ahead = rem[c]
        if ahead != 0:
            rem[c] = ahead - 1
        else:
            r = nxt[c]
            # value: a symbol of the class's model, then the bits below a large z's leading one
            e = vpacked[row[c], x & (TOTAL - 1)]
            z = e >> 24
            x = ((e >> 12) & 0xFFF) * (x >> PRECISION) + (e & 0xFFF)
            if x < STATE_LOW:
                if pos == n_words:
                    return PAST_END
                x = (x << 16) | int(words[pos])
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
                    x = (x << 16) | int(words[pos])
                    pos += 1
                extra = (extra << lo_bits) | (x & ((1 << lo_bits) - 1))
                x >>= lo_bits
                if x < STATE_LOW:
                    if pos == n_words:
                        return PAST_END
                    x = (x << 16) | int(words[pos])
                    pos += 1
                z = (np.int64(1) << nb) | extra
            zig = z + 1
            d = -((zig + 1) >> 1) if zig & 1 else zig >> 1
            new[i] = (a + d) & wmask
            rest = left[c] - 1
            left[c] = rest
            t = code_t[c]
            if rest == 0:
                rem[c] = AHEAD  # nxt keeps the last changed rank: `class_sizes` counts from it
            elif t < 0:
                nxt[c] = r + 1  # rem stays 0: the class's next member is its next change
            else:
                # gap: a geometric symbol q (64 escapes to 32 raw bits), then b raw bits
                e = gpacked[t, x & (TOTAL - 1)]
                q = e >> 24
                x = ((e >> 12) & 0xFFF) * (x >> PRECISION) + (e & 0xFFF)
                if x < STATE_LOW:
                    if pos == n_words:
                        return PAST_END
                    x = (x << 16) | int(words[pos])
                    pos += 1
                if q == Q_ESCAPE:  # 32 raw bits: high 16, then low 16
                    e = x & 0xFFFF
                    x >>= 16
                    if x < STATE_LOW:
                        if pos == n_words:
                            return PAST_END
                        x = (x << 16) | int(words[pos])
                        pos += 1
                    e = (e << 16) | (x & 0xFFFF)
                    x >>= 16
                    if x < STATE_LOW:
                        if pos == n_words:
                            return PAST_END
                        x = (x << 16) | int(words[pos])
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
                    x = (x << 16) | int(words[pos])
                    pos += 1
                g = (g << lo_bits) | (x & ((1 << lo_bits) - 1))
                x >>= lo_bits
                if x < STATE_LOW:
                    if pos == n_words:
                        return PAST_END
                    x = (x << 16) | int(words[pos])
                    pos += 1
                nxt[c] = r + 1 + g
                rem[c] = g
    state[0], state[1] = x, pos
    return OK
