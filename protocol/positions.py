"""Sparse positions coded as gaps between ranks within each context class.

Inside one (tensor, context) class of n positions with k marked, marks are close to a
Bernoulli(k/n) process, so the gaps between consecutive ranks are geometric. Each gap g is
split Rice-style into q = g >> b and r = g & (2**b - 1): r is b raw bits and q is geometric
with ratio theta ~ (1 - k/n)**(2**b), coded with one of eight fixed geometric models (THETAS;
q >= Q_ESCAPE escapes to 32 raw bits). The encoder picks (b, theta) per class by the exact cost
of its own gaps and sends them as one code byte; the decoder needs nothing but that byte, so it
can decode a class before it has counted the class's members.

A code byte is 0 for a class whose every position is marked (no gap is coded: the class size
implies them) and 1 + 8 * b + t otherwise (b <= MAX_B, t indexes THETAS).

Class table on the wire, per tensor: varint classes; per class: varint context delta, varint k,
u8 code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np

from protocol.ans import OK, PAST_END, PRECISION, STATE_LOW, TOTAL, AnsDecoder, AnsEncoder, Models, dec_bits, dec_cat
from protocol.contexts import NUM_CONTEXTS
from protocol.errors import InvalidPositions, MalformedPayload, SizeLimitExceeded, TruncatedPayload
from protocol.wire import Reader, Writer

Q_ESCAPE = 64  # q symbols 0..63 are literal, 64 means "q - 64 follows as 32 raw bits"
ESCAPE_BITS = 32
THETAS = (64, 128, 160, 184, 204, 218, 230, 242)  # geometric ratios, out of 256
MAX_B = 23
FULL = 0  # code byte of a class whose every position is marked
MAX_CODE = 1 + 8 * MAX_B + len(THETAS) - 1
_B_TRIES = 3  # candidate b per class: around the b that puts theta near 0.85

_jit = numba.njit(nogil=True, cache=True)
_inline = numba.njit(nogil=True, cache=True, inline="always")


def _geometric_counts(theta_256: int) -> np.ndarray:
    """Integer weights of a geometric law with ratio theta_256/256 over q = 0..63, plus the tail."""
    w = [1 << 40]
    for _ in range(Q_ESCAPE - 1):
        w.append(w[-1] * theta_256 >> 8)
    head = [max(1, x * (256 - theta_256) >> 8) for x in w]
    return np.array([*head, max(1, w[-1] * theta_256 >> 8)], dtype=np.int64)


GEOMETRIC = Models.from_counts(np.stack([_geometric_counts(t) for t in THETAS]), compiled=False)
GEOMETRIC_SYM, GEOMETRIC_FREQ, GEOMETRIC_CUM = GEOMETRIC.sym, GEOMETRIC.freq, GEOMETRIC.cum  # compiled in
GEOMETRIC_PACKED = GEOMETRIC.packed
# cost in bits of each q symbol under each model, for the encoder's choice of (b, theta)
_Q_COST = PRECISION - np.log2(GEOMETRIC.freq.astype(np.float64))
_Q_COST[:, Q_ESCAPE] += ESCAPE_BITS


def code_of(b: int, t: int) -> int:
    return 1 + 8 * b + t


def split_code(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(b, t) of code bytes (FULL gives b = 0, t = -1)."""
    c = np.asarray(code, dtype=np.int64) - 1
    return np.where(c >= 0, c >> 3, 0), np.where(c >= 0, c & 7, -1)


def log2_binomial(n: int, k: int) -> float:
    """log2 C(n, k): the bits any coder needs for which k of n positions are marked."""
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


# -- compiled gap coding ------------------------------------------------------------------------


@_inline
def dec_gap(x: int, pos: int, words: np.ndarray, b: int, t: int) -> tuple[int, int, int, int]:
    """Pop one gap: (x, pos, gap, status)."""
    x, pos, q, status = dec_cat(x, pos, words, t, GEOMETRIC_SYM, GEOMETRIC_FREQ, GEOMETRIC_CUM)
    if status != OK:
        return x, pos, 0, status
    if q == Q_ESCAPE:
        x, pos, hi, status = dec_bits(x, pos, words, 16)
        if status != OK:
            return x, pos, 0, status
        x, pos, lo, status = dec_bits(x, pos, words, 16)
        q += (hi << 16) | lo
    r = 0
    if b > 16:
        x, pos, hi, status = dec_bits(x, pos, words, b - 16)
        if status != OK:
            return x, pos, 0, status
        x, pos, lo, status = dec_bits(x, pos, words, 16)
        r = (hi << 16) | lo
    elif b > 0:
        x, pos, r, status = dec_bits(x, pos, words, b)
    return x, pos, (q << b) | r, status


@_jit
def _choose_codes(
    cls: np.ndarray, gaps: np.ndarray, n: np.ndarray, k: np.ndarray, q_cost: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per class (length of n): the cheapest code byte for its gaps, and that cost in bits.

    `cls`, `gaps`: one entry per coded gap (any order); an empty `cls` means the gaps are grouped
    by class instead, k[c] of them for class c in ascending order. Classes with k == n get FULL.
    """
    classes = len(n)
    b0 = np.zeros(classes, np.int64)
    for c in range(classes):
        if k[c] > 0 and k[c] < n[c]:
            m = 0.1625 * n[c] / k[c]
            b0[c] = max(0, min(MAX_B - _B_TRIES + 1, round(math.log2(max(m, 1.0))) - _B_TRIES // 2))
    hist = np.zeros((classes, _B_TRIES, Q_ESCAPE + 1), np.int64)
    count = np.zeros(classes, np.int64)
    grouped_class, left = 0, 0
    for i in range(len(gaps)):
        if len(cls):
            c = int(cls[i])
        else:
            while left == 0:
                left, grouped_class = k[grouped_class], grouped_class + 1
            c, left = grouped_class - 1, left - 1
        count[c] += 1
        for j in range(_B_TRIES):
            hist[c, j, min(gaps[i] >> (b0[c] + j), Q_ESCAPE)] += 1
    codes = np.zeros(classes, np.int64)
    costs = np.zeros(classes, np.float64)
    for c in range(classes):
        if k[c] == 0 or k[c] == n[c]:
            continue
        best, best_code = np.inf, 0
        for j in range(_B_TRIES):
            b = b0[c] + j
            top = Q_ESCAPE  # the largest q seen: symbols above it add nothing
            while top > 0 and hist[c, j, top] == 0:
                top -= 1
            for t in range(q_cost.shape[0]):
                bits = 0.0
                for s in range(top + 1):
                    bits += hist[c, j, s] * q_cost[t, s]
                bits += b * count[c]
                if bits < best:
                    best, best_code = bits, 1 + 8 * b + t
        codes[c], costs[c] = best_code, best
    return codes, costs


def choose_codes(
    cls: np.ndarray | None, gaps: np.ndarray, n: np.ndarray, k: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(code byte, bits) per class for the coded gaps `gaps` of classes `cls` (None: grouped by
    class, k[c] each); see `_choose_codes`."""
    cls_ = np.zeros(0, np.uint8) if cls is None else np.ascontiguousarray(cls)
    as64 = lambda a: np.ascontiguousarray(a, np.int64)  # noqa: E731
    return _choose_codes(cls_, np.ascontiguousarray(gaps), as64(n), as64(k), _Q_COST)


# -- gap streams through the segment coder (SparseLoCo, PULSELoCo) -------------------------------


@_jit
def _enc_gaps(
    x: int,
    out: np.ndarray,
    pos: int,
    gaps: np.ndarray,
    k: np.ndarray,
    code: np.ndarray,
    gfreq: np.ndarray,
    gcum: np.ndarray,
) -> tuple[int, int]:
    """Push groups of gaps backwards (group g: k[g] gaps under code[g]; FULL groups carry none).
    Read order per gap: its q symbol, 32 escape bits if q >= Q_ESCAPE, its b remainder bits."""
    i = len(gaps)
    for group in range(len(k) - 1, -1, -1):
        i -= k[group]
        if code[group] == FULL:
            continue
        b, t = (code[group] - 1) >> 3, (code[group] - 1) & 7
        lo = b if b <= 16 else 16
        for j in range(i + k[group] - 1, i - 1, -1):
            g = int(gaps[j])
            if lo > 0:  # the remainder: low 16 bits pushed first, read last
                if x >= np.int64(1) << (32 - lo):
                    pos -= 1
                    out[pos] = x & 0xFFFF
                    x >>= 16
                x = (x << lo) | (g & ((1 << lo) - 1))
            if b > 16:
                if x >= np.int64(1) << (32 - (b - 16)):
                    pos -= 1
                    out[pos] = x & 0xFFFF
                    x >>= 16
                x = (x << (b - 16)) | ((g >> 16) & ((np.int64(1) << (b - 16)) - 1))
            q = g >> b
            if q >= Q_ESCAPE:
                e = q - Q_ESCAPE
                if e >> 32:
                    raise ValueError("a gap is too long for its code")
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
    return x, pos


@_jit
def _dec_gaps(
    x: int, pos: int, words: np.ndarray, k: np.ndarray, code: np.ndarray, gpacked: np.ndarray
) -> tuple[int, int, np.ndarray, int]:
    out = np.zeros(k.sum(), np.int64)  # FULL groups: every gap 0
    n_words = len(words)
    i = 0
    for group in range(len(k)):
        if code[group] == FULL:
            i += k[group]
            continue
        b, t = (code[group] - 1) >> 3, (code[group] - 1) & 7
        hi_bits = b - 16 if b > 16 else 0
        lo_bits = b - hi_bits
        for _ in range(k[group]):
            e = gpacked[t, x & (TOTAL - 1)]
            q = int(e >> 24)
            x = ((e >> 12) & 0xFFF) * (x >> PRECISION) + (e & 0xFFF)
            if x < STATE_LOW:
                if pos == n_words:
                    return x, pos, out, PAST_END
                x = (x << 16) | int(words[pos])
                pos += 1
            if q == Q_ESCAPE:
                for _piece in range(2):
                    q = (q << 16) | (x & 0xFFFF) if _piece else (x & 0xFFFF)
                    x >>= 16
                    if x < STATE_LOW:
                        if pos == n_words:
                            return x, pos, out, PAST_END
                        x = (x << 16) | int(words[pos])
                        pos += 1
                q += Q_ESCAPE
            g = (q << hi_bits) | (x & ((1 << hi_bits) - 1))
            x >>= hi_bits
            if x < STATE_LOW:
                if pos == n_words:
                    return x, pos, out, PAST_END
                x = (x << 16) | int(words[pos])
                pos += 1
            g = (g << lo_bits) | (x & ((1 << lo_bits) - 1))
            x >>= lo_bits
            if x < STATE_LOW:
                if pos == n_words:
                    return x, pos, out, PAST_END
                x = (x << 16) | int(words[pos])
                pos += 1
            out[i] = g
            i += 1
    return x, pos, out, OK


def group_cost(k: np.ndarray, code: np.ndarray) -> tuple[int, int]:
    """(geometric symbols, remainder bits) that gaps in these groups take at the very least."""
    coded = code != FULL
    b, _ = split_code(code[coded])
    return int(k[coded].sum()), int((k[coded] * b).sum())


def encode_gaps(enc: AnsEncoder, gaps: np.ndarray, k: np.ndarray, code: np.ndarray) -> None:
    """Queue gaps in groups: group g is k[g] consecutive gaps under code byte code[g] (FULL: none
    coded, the group is every position of its class). Gaps must fit their code."""
    k, code = np.ascontiguousarray(k, np.int64), np.ascontiguousarray(code, np.int64)
    gaps = np.ascontiguousarray(gaps)
    if int(k.sum()) != len(gaps) or np.any((code < 0) | (code > MAX_CODE)):
        raise ValueError("gap groups must cover the gaps, with known codes")
    symbols, _ = group_cost(k, code)
    enc.segment(_enc_gaps, (gaps, k, code, GEOMETRIC_FREQ, GEOMETRIC_CUM), 5 * symbols)


def decode_gaps(dec: AnsDecoder, k: np.ndarray, code: np.ndarray, what: str = "positions stream") -> np.ndarray:
    """Inverse of `encode_gaps` (FULL groups get 0), after checking the stream can hold them."""
    k, code = np.ascontiguousarray(k, np.int64), np.ascontiguousarray(code, np.int64)
    dec.require(*group_cost(k, code), what)
    return dec.run(_dec_gaps, k, code, GEOMETRIC_PACKED)


@dataclass
class ClassTable:
    """One tensor's marked positions, grouped by context class, and the code of each class's gaps."""

    classes: np.ndarray  # active context ids, ascending
    k: np.ndarray  # marked positions per active class
    code: np.ndarray  # code byte per active class (FULL: every position of the class)

    @property
    def total(self) -> int:
        return int(self.k.sum())


@_inline
def _put_varint(out: np.ndarray, n: int, value: int) -> int:
    while True:
        out[n] = (value & 0x7F) | (0x80 if value > 0x7F else 0)
        n += 1
        value >>= 7
        if value == 0:
            return n


@_jit
def _table_bytes(classes: np.ndarray, k: np.ndarray, code: np.ndarray) -> np.ndarray:
    out = np.empty(2 + 13 * len(classes), np.uint8)
    n = _put_varint(out, 0, len(classes))
    prev = -1
    for i in range(len(classes)):
        n = _put_varint(out, n, classes[i] - prev - 1)
        n = _put_varint(out, n, k[i])
        out[n] = code[i]
        n += 1
        prev = classes[i]
    return out[:n].copy()


def write_table(w: Writer, table: ClassTable) -> None:
    """varint classes; per class: varint context delta, varint k, u8 code."""
    w.raw(_table_bytes(table.classes, table.k, table.code).tobytes())


# status codes of `_parse_table`, each a different rejection
_TRUNCATED, _TOO_BIG, _CONTEXT, _ZERO_K, _TOTAL, _CODE = 1, 2, 3, 4, 5, 6


@_inline
def _varint(buf: np.ndarray, pos: int, bound: int) -> tuple[int, int, int]:
    """(value, next pos, status) of the LEB128 integer at pos, which must be <= bound."""
    value = 0
    for i in range(10):
        if pos >= len(buf):
            return 0, pos, _TRUNCATED
        byte = int(buf[pos])
        pos += 1
        if i == 9 and byte > 1:
            return 0, pos, _TOO_BIG
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            if value > bound or value < 0:
                return 0, pos, _TOO_BIG
            return value, pos, OK
    return 0, pos, _TOO_BIG


@_jit
def _parse_table(buf: np.ndarray, numel: int) -> tuple[int, int, np.ndarray]:
    """(status, bytes read, rows of (class, k, code)) of one class table at the start of buf."""
    rows = np.zeros((0, 3), np.int64)
    count, pos, status = _varint(buf, 0, NUM_CONTEXTS)
    if status != OK:
        return status, pos, rows
    rows = np.zeros((count, 3), np.int64)
    cls, total = -1, 0
    for i in range(count):
        delta, pos, status = _varint(buf, pos, NUM_CONTEXTS)
        if status != OK:
            return status, pos, rows
        cls += 1 + delta
        if cls >= NUM_CONTEXTS:
            return _CONTEXT, pos, rows
        k, pos, status = _varint(buf, pos, numel)
        if status != OK:
            return status, pos, rows
        if k == 0:
            return _ZERO_K, pos, rows
        total += k
        if total > numel:
            return _TOTAL, pos, rows
        if pos >= len(buf):
            return _TRUNCATED, pos, rows
        code = int(buf[pos])
        pos += 1
        if code > MAX_CODE:
            return _CODE, pos, rows
        rows[i, 0], rows[i, 1], rows[i, 2] = cls, k, code
    return OK, pos, rows


_TABLE_ERRORS = {
    _TRUNCATED: (TruncatedPayload, "the class table is cut short"),
    _TOO_BIG: (SizeLimitExceeded, "a class-table count exceeds its bound"),
    _CONTEXT: (MalformedPayload, "a context is out of range"),
    _ZERO_K: (MalformedPayload, "a context is listed with no marked position"),
    _TOTAL: (InvalidPositions, "more marked positions than the tensor holds"),
    _CODE: (MalformedPayload, "an unknown gap code"),
}


def read_table(r: Reader, name: str, numel: int) -> ClassTable:
    """Inverse of `write_table`, checked against the header's own bounds (k <= numel, in total
    too; a known code byte). The receiver checks k against its class sizes as it walks them."""
    buf = np.frombuffer(r.peek(), dtype=np.uint8)
    status, used, rows = _parse_table(buf, numel)
    if status != OK:
        kind, what = _TABLE_ERRORS[status]
        raise kind(f"{r.what}: {name}: {what}")
    r.raw(used)
    return ClassTable(rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy())


def table_groups(tables: Sequence[ClassTable]) -> tuple[np.ndarray, np.ndarray]:
    """(k, code) of every class of these tables, in order: the gap groups of their stream."""
    if not tables:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([t.k for t in tables]), np.concatenate([t.code for t in tables])
