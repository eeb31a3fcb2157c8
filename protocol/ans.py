"""Entropy coding with range asymmetric numeral systems (rANS), compiled with numba, bounded.

One coder state x in [2**16, 2**32); words are 16 bits. Every categorical model is quantized to
frequencies summing to 2**PRECISION with integer arithmetic only (`normalize`), so encoder and
decoder can never disagree on a table. Raw bits (uniform over a power of two, at most 16 per
operation) are coded in the same state.

ANS is a stack: symbols are encoded in the reverse of the order they are decoded. `AnsEncoder`
therefore queues segments in *decode* order and encodes them backwards in `finish()`, so format
code reads top to bottom the same way for both directions. Stream layout: the final encoder
state (two words, high first), then the words in the order the decoder reads them.

Hostile streams are bounded two ways. No symbol is ever near-certain (a model's largest
frequency is at most 7/8 of the total), so every categorical symbol shrinks the decoder's state
by at least log2(1 / (7/8 * 17/16)) > 0.105 bits, and raw bits by their count; the state gains
16 bits per word read and must end at exactly 2**16. A stream of W words therefore carries at
most 16 * W bits of symbols: `AnsDecoder.require` refuses a header that claims more before any
work is done, and reading past the last word raises instead of inventing zeros.

Segments are compiled kernels (`AnsEncoder.segment`, `AnsDecoder.run`): categorical runs and raw
bits here, gap groups in positions.py; PULSESync's per-weight walk codes its own symbols
(syncpass.py). Hot loops write the rANS steps out rather than call helpers: numba's calls cost
as much as the coding there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

from protocol.errors import MalformedPayload, SizeLimitExceeded, TrailingBytes, TruncatedPayload
from protocol.wire import Reader, Writer

PRECISION = 12
TOTAL = 1 << PRECISION
MAX_FREQ = TOTAL - TOTAL // 8  # no symbol costs less than log2(8/7) bits before coding loss
MIN_SYMBOL_BITS = 0.1  # a proven lower bound on what one categorical symbol consumes (see above)
RAW_MAX = 16  # raw bits per operation
STATE_LOW = 1 << 16  # the encoder's initial state, and the decoder's required final state
WORD_BITS = 16

# status codes returned by compiled decode loops
OK, PAST_END = 0, 1

_jit = numba.njit(nogil=True, cache=True)
_inline = numba.njit(nogil=True, cache=True, inline="always")


# -- models -----------------------------------------------------------------------------------


@_jit
def _normalize(c: np.ndarray) -> np.ndarray:  # (see `normalize`)
    total = c.sum()
    if total == 0:
        c = np.ones_like(c)
        total = len(c)
    f = c * TOTAL // total
    for i in range(len(f)):
        if c[i] > 0 and f[i] == 0:
            f[i] = 1
    diff = TOTAL - f.sum()
    while diff != 0:
        j = int(np.argmax(f))
        step = diff if diff > 0 else -min(-diff, f[j] - 1)
        f[j] += step
        diff -= step
    top = np.argmax(f)
    if f[top] > MAX_FREQ:
        f[(top + 1) % len(f)] += f[top] - MAX_FREQ
        f[top] = MAX_FREQ
    return f


def normalize(counts: np.ndarray) -> np.ndarray:
    """Integer frequencies summing to TOTAL for a histogram (int64, any length >= 2).

    Every symbol with a nonzero count gets at least 1; no symbol gets more than MAX_FREQ (the
    excess goes to the next symbol, cyclically). An all-zero histogram gives a flat model.
    Deterministic integer arithmetic: both ends compute the same table from the same counts.
    """
    c = np.asarray(counts, dtype=np.int64)
    if len(c) < 2 or np.any(c < 0):
        raise ValueError("a model needs at least two symbols and non-negative counts")
    if int(c.max(initial=0)) > (1 << 62) // TOTAL:
        raise ValueError("counts too large to normalize exactly")
    return _normalize(c.copy())


@_jit
def _tables(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    models, alphabet = counts.shape
    freq = np.empty((models, alphabet), np.int64)
    cum = np.empty((models, alphabet), np.int64)
    sym = np.empty((models, TOTAL), np.int32)
    packed = np.empty((models, TOTAL if alphabet <= 256 else 0), np.int32)
    for m in range(models):
        freq[m] = _normalize(counts[m].copy())
        start = 0
        for s in range(alphabet):
            cum[m, s] = start
            sym[m, start : start + freq[m, s]] = s
            if alphabet <= 256:
                for slot in range(start, start + freq[m, s]):
                    packed[m, slot] = (s << 24) | (freq[m, s] << 12) | (slot - start)
            start += freq[m, s]
    return freq, cum, sym, packed


def _tables_interpreted(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`_tables` by the interpreter, with the same integer arithmetic (for import-time tables)."""
    models, alphabet = counts.shape
    freq = np.stack([_normalize.py_func(row.copy()) for row in counts])
    cum = np.cumsum(freq, axis=1) - freq
    sym = np.stack([np.repeat(np.arange(alphabet), row) for row in freq]).astype(np.int32)
    slot = np.arange(TOTAL)
    packed = (sym.astype(np.int64) << 24) | (np.take_along_axis(freq, sym, axis=1) << 12)
    packed |= slot[None, :] - np.take_along_axis(cum, sym, axis=1)
    packed = packed.astype(np.int32) if alphabet <= 256 else np.empty((models, 0), np.int32)
    return freq, cum, sym, packed


@dataclass(frozen=True)
class Models:
    """A set of categorical models over one alphabet, one row each, as coding tables."""

    freq: np.ndarray  # (models, alphabet) int64
    cum: np.ndarray  # (models, alphabet) int64, start of each symbol's slot range
    sym: np.ndarray  # (models, TOTAL) int32, the symbol owning each slot
    # (models, TOTAL) int32 for alphabets of at most 256 symbols, else (models, 0): per slot, its
    # symbol << 24 | frequency << 12 | slot - cumulative, so a decoding step is one table load
    packed: np.ndarray

    @classmethod
    def from_counts(cls, counts: np.ndarray, *, compiled: bool = True) -> Models:
        """Tables for one model per row of `counts`. `compiled=False` builds the same tables with
        the interpreter: for tables made at import time, before anything is compiled."""
        counts = np.ascontiguousarray(np.atleast_2d(np.asarray(counts, dtype=np.int64)))
        if counts.shape[1] < 2 or np.any(counts < 0) or int(counts.max(initial=0)) > (1 << 62) // TOTAL:
            raise ValueError("models need at least two symbols and non-negative counts below 2**50")
        return cls(*(_tables(counts) if compiled else _tables_interpreted(counts)))

    @property
    def alphabet(self) -> int:
        return int(self.freq.shape[1])


# -- compiled primitives ----------------------------------------------------------------------


@_inline
def _refill(x: int, pos: int, words: np.ndarray) -> tuple[int, int, int]:
    if x < STATE_LOW:
        if pos >= len(words):
            return x, pos, PAST_END
        x = (x << WORD_BITS) | int(words[pos])
        pos += 1
    return x, pos, OK


@_inline
def dec_cat(
    x: int, pos: int, words: np.ndarray, m: int, sym: np.ndarray, freq: np.ndarray, cum: np.ndarray
) -> tuple[int, int, int, int]:
    """Pop one symbol of model row m: (x, pos, symbol, status)."""
    slot = x & (TOTAL - 1)
    s = sym[m, slot]
    x = freq[m, s] * (x >> PRECISION) + slot - cum[m, s]
    x, pos, status = _refill(x, pos, words)
    return x, pos, s, status


@_inline
def dec_bits(x: int, pos: int, words: np.ndarray, nbits: int) -> tuple[int, int, int, int]:
    """Pop nbits <= 16 raw bits: (x, pos, value, status)."""
    v = x & ((1 << nbits) - 1)
    x >>= nbits
    x, pos, status = _refill(x, pos, words)
    return x, pos, v, status


# The segment loops write the steps out rather than call the primitives above: numba's calls in
# a loop this tight cost as much as the coding (measured: 2x to 3x).


@_jit
def _enc_bits(x: int, out: np.ndarray, pos: int, values: np.ndarray, nbits: np.ndarray) -> tuple[int, int]:
    for i in range(len(values) - 1, -1, -1):
        b, v = nbits[i], values[i]
        lo = b if b <= RAW_MAX else RAW_MAX  # decode order: the high piece, then the low 16 bits
        if lo > 0:
            if x >= np.int64(1) << (32 - lo):
                pos -= 1
                out[pos] = x & 0xFFFF
                x >>= WORD_BITS
            x = (x << lo) | (v & ((np.int64(1) << lo) - 1))
        if b > RAW_MAX:
            if x >= np.int64(1) << (32 - (b - RAW_MAX)):
                pos -= 1
                out[pos] = x & 0xFFFF
                x >>= WORD_BITS
            x = (x << (b - RAW_MAX)) | (v >> RAW_MAX)
    return x, pos


@_jit
def _dec_bits(x: int, pos: int, words: np.ndarray, nbits: np.ndarray) -> tuple[int, int, np.ndarray, int]:
    out = np.zeros(len(nbits), dtype=np.int64)
    n_words = len(words)
    for i in range(len(nbits)):
        b = nbits[i]
        hi = b - RAW_MAX if b > RAW_MAX else 0
        v = 0
        for take in (hi, b - hi):  # the high piece first, then up to 16 bits
            if take > 0:
                v = (v << take) | (x & ((1 << take) - 1))
                x >>= take
                if x < STATE_LOW:
                    if pos == n_words:
                        return x, pos, out, PAST_END
                    x = (x << WORD_BITS) | int(words[pos])
                    pos += 1
        out[i] = v
    return x, pos, out, OK


@_jit
def _enc_runs(
    x: int,
    out: np.ndarray,
    pos: int,
    symbols: np.ndarray,
    run_ids: np.ndarray,
    run_lengths: np.ndarray,
    freq: np.ndarray,
    cum: np.ndarray,
) -> tuple[int, int]:
    """Symbols in runs: the first run_lengths[0] under model run_ids[0], and so on."""
    i = len(symbols)
    for r in range(len(run_ids) - 1, -1, -1):
        m = run_ids[r]
        for _ in range(run_lengths[r]):
            i -= 1
            s = symbols[i]
            f = freq[m, s]
            if x >= f << (32 - PRECISION):
                pos -= 1
                out[pos] = x & 0xFFFF
                x >>= WORD_BITS
            d = x // f
            x = (d << PRECISION) + (x - d * f) + cum[m, s]
    return x, pos


@_jit
def _dec_runs(
    x: int,
    pos: int,
    words: np.ndarray,
    run_ids: np.ndarray,
    run_lengths: np.ndarray,
    sym: np.ndarray,
    freq: np.ndarray,
    cum: np.ndarray,
) -> tuple[int, int, np.ndarray, int]:
    out = np.empty(run_lengths.sum(), dtype=np.int32)
    n_words = len(words)
    i = 0
    for r in range(len(run_ids)):
        m = run_ids[r]
        for _ in range(run_lengths[r]):
            slot = x & (TOTAL - 1)
            s = np.int64(sym[m, slot])
            x = freq[m, s] * (x >> PRECISION) + slot - cum[m, s]
            if x < STATE_LOW:
                if pos == n_words:
                    return x, pos, out, PAST_END
                x = (x << WORD_BITS) | int(words[pos])
                pos += 1
            out[i] = s
            i += 1
    return x, pos, out, OK


@_jit
def _enc_fixed_bits(x: int, out: np.ndarray, pos: int, values: np.ndarray, nbits: int) -> tuple[int, int]:
    """Every value as nbits raw bits (decode order per value: the high piece, then 16 bits)."""
    lo = nbits if nbits <= RAW_MAX else RAW_MAX
    hi = nbits - lo
    for i in range(len(values) - 1, -1, -1):
        v = int(values[i])
        if lo > 0:
            if x >= np.int64(1) << (32 - lo):
                pos -= 1
                out[pos] = x & 0xFFFF
                x >>= WORD_BITS
            x = (x << lo) | (v & ((1 << lo) - 1))
        if hi > 0:
            if x >= np.int64(1) << (32 - hi):
                pos -= 1
                out[pos] = x & 0xFFFF
                x >>= WORD_BITS
            x = (x << hi) | (v >> lo)
    return x, pos


@_jit
def _dec_fixed_bits(
    x: int, pos: int, words: np.ndarray, out: np.ndarray, nbits: int
) -> tuple[int, int, np.ndarray, int]:
    """Fill `out` with nbits-bit raw values."""
    count = len(out)
    n_words = len(words)
    lo = nbits if nbits <= RAW_MAX else RAW_MAX
    hi = nbits - lo
    for i in range(count):
        v = 0
        if hi > 0:
            v = x & ((1 << hi) - 1)
            x >>= hi
            if x < STATE_LOW:
                if pos == n_words:
                    return x, pos, out, PAST_END
                x = (x << WORD_BITS) | int(words[pos])
                pos += 1
        if lo > 0:
            v = (v << lo) | (x & ((1 << lo) - 1))
            x >>= lo
            if x < STATE_LOW:
                if pos == n_words:
                    return x, pos, out, PAST_END
                x = (x << WORD_BITS) | int(words[pos])
                pos += 1
        out[i] = v
    return x, pos, out, OK


@_jit
def _all_codable(symbols: np.ndarray, run_ids: np.ndarray, run_lengths: np.ndarray, freq: np.ndarray) -> bool:
    i = 0
    for r in range(len(run_ids)):
        m = run_ids[r]
        if m < 0 or m >= freq.shape[0]:
            return False
        for _ in range(run_lengths[r]):
            s = symbols[i]
            if s < 0 or s >= freq.shape[1] or freq[m, s] == 0:
                return False
            i += 1
    return True


@_jit
def runs_of(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(id, length) of each run of equal consecutive ids."""
    n_runs = 1 if len(ids) else 0
    for i in range(1, len(ids)):
        n_runs += ids[i] != ids[i - 1]
    run_ids = np.empty(n_runs, np.int64)
    lengths = np.zeros(n_runs, np.int64)
    r = -1
    for i in range(len(ids)):
        if i == 0 or ids[i] != ids[i - 1]:
            r += 1
            run_ids[r] = ids[i]
        lengths[r] += 1
    return run_ids, lengths


# -- segment coder ----------------------------------------------------------------------------


def require(words: np.ndarray, categorical: int, raw_bits: int = 0, what: str = "entropy-coded section") -> None:
    """Raise SizeLimitExceeded if `words` cannot hold that many categorical symbols and raw bits.
    Callers check what a header claims with this before building anything of that size."""
    need = categorical * MIN_SYMBOL_BITS + raw_bits
    if need > WORD_BITS * len(words):
        raise SizeLimitExceeded(
            f"{what}: {categorical} symbols and {raw_bits} raw bits need at least {need:.0f} bits, "
            f"the stream holds {WORD_BITS * len(words)}"
        )


Runs = tuple[np.ndarray, np.ndarray]  # (model row per run, symbols per run)


def _runs(model_ids: np.ndarray | int | None, runs: Runs | None, n: int) -> Runs:
    if runs is not None:
        return np.ascontiguousarray(runs[0], np.int64), np.ascontiguousarray(runs[1], np.int64)
    if model_ids is None or isinstance(model_ids, (int, np.integer)):
        return np.array([int(model_ids or 0)], np.int64), np.array([n], np.int64)
    return runs_of(np.ascontiguousarray(model_ids))


Kernel = Callable[..., tuple[int, int]]


class AnsEncoder:
    """Queue segments in decode order; `finish()` codes them and returns the words (uint16).

    A segment is a compiled kernel `kernel(x, out, pos, *args) -> (x, pos)` that pushes its
    symbols backwards (see the module docstring) and at most `max_words` words."""

    def __init__(self) -> None:
        self._segments: list[tuple[Kernel, tuple[object, ...]]] = []
        self._max_words = 4

    def segment(self, kernel: Kernel, args: tuple[object, ...], max_words: int) -> None:
        self._segments.append((kernel, args))
        self._max_words += max_words

    def categorical(
        self,
        symbols: np.ndarray,
        models: Models,
        model_ids: np.ndarray | int | None = None,
        *,
        runs: Runs | None = None,
    ) -> None:
        """symbols[i] under model row model_ids[i] (one row for all if an int), or in `runs`."""
        symbols = np.ascontiguousarray(symbols)
        if not symbols.size:
            return
        run_ids, lengths = _runs(model_ids, runs, symbols.size)
        if int(lengths.sum()) != symbols.size or not _all_codable(symbols, run_ids, lengths, models.freq):
            raise ValueError("every symbol needs a model that gives it a nonzero frequency")
        self.segment(_enc_runs, (symbols, run_ids, lengths, models.freq, models.cum), symbols.size)

    def bits(self, values: np.ndarray, nbits: np.ndarray | int) -> None:
        """values[i] as nbits (or nbits[i]) raw bits, 0..32; values must fit."""
        values = np.ascontiguousarray(values)
        if not values.size:
            return
        if isinstance(nbits, (int, np.integer)):
            # the extremes, not an elementwise test: no temporaries the size of `values`
            if not 0 <= nbits <= 2 * RAW_MAX or int(values.min()) < 0 or int(values.max()) >> int(nbits) != 0:
                raise ValueError("raw values must fit their bit count (at most 32)")
            self.segment(_enc_fixed_bits, (values, int(nbits)), 2 * values.size)
            return
        nb = np.ascontiguousarray(nbits, dtype=np.int64)
        values = values.astype(np.int64, copy=False)
        if np.any((nb < 0) | (nb > 2 * RAW_MAX)) or np.any((values < 0) | (values >> nb != 0)):
            raise ValueError("raw values must fit their bit counts (at most 32)")
        self.segment(_enc_bits, (values, nb), 2 * values.size)

    def finish(self) -> np.ndarray:
        out = np.empty(self._max_words, dtype=np.uint16)
        x, pos = STATE_LOW, len(out)
        for kernel, args in reversed(self._segments):
            x, pos = kernel(x, out, pos, *args)
        out[pos - 2], out[pos - 1] = x >> WORD_BITS, x & 0xFFFF
        # a view, not a copy: the buffer is written from its end, so only the stream's own pages are
        # resident, and a copy would hold a stream of hundreds of MB twice at once
        return out[pos - 2 :]


class AnsDecoder:
    """Pops segments in the order they were queued. Every failure is a `MalformedPayload` subclass."""

    def __init__(self, words: np.ndarray) -> None:
        self.words = np.ascontiguousarray(words, dtype=np.uint16)
        if len(self.words) < 2:
            raise TruncatedPayload("entropy-coded section is shorter than its two-word state")
        self.x = (int(self.words[0]) << WORD_BITS) | int(self.words[1])
        self.pos = 2
        if self.x < STATE_LOW:
            raise MalformedPayload("entropy-coded section starts with an impossible state")

    @property
    def capacity_bits(self) -> int:
        """What the whole stream can carry: an upper bound on the bits of every symbol in it."""
        return WORD_BITS * len(self.words)

    def require(self, categorical: int, raw_bits: int = 0, what: str = "entropy-coded section") -> None:
        """Refuse a header that claims more symbols than the stream can possibly hold."""
        require(self.words, categorical, raw_bits, what)

    def run(self, kernel: Callable[..., tuple[int, int, np.ndarray, int]], *args: object) -> np.ndarray:
        """Pop a segment with a compiled `kernel(x, pos, words, *args) -> (x, pos, out, status)`."""
        self.x, self.pos, out, status = kernel(self.x, self.pos, self.words, *args)
        if status == PAST_END:
            raise TruncatedPayload("entropy-coded section ends before its last symbol")
        return out

    def categorical(
        self,
        models: Models,
        model_ids: np.ndarray | int | None = None,
        count: int | None = None,
        *,
        runs: Runs | None = None,
    ) -> np.ndarray:
        """Symbols (int32) under model rows model_ids (an int and a count: that row for all), or in `runs`."""
        n = count if count is not None else (int(np.sum(runs[1])) if runs is not None else len(np.asarray(model_ids)))
        if n == 0:
            return np.zeros(0, dtype=np.int32)
        self.require(n)
        run_ids, lengths = _runs(model_ids, runs, n)
        return self.run(_dec_runs, run_ids, lengths, models.sym, models.freq, models.cum)

    def bits(self, nbits: np.ndarray | int, count: int | None = None) -> np.ndarray:
        if isinstance(nbits, (int, np.integer)):
            n = int(count or 0)
            self.require(0, n * int(nbits))
            out = np.empty(n, dtype=np.int32 if nbits < 32 else np.int64)
            return self.run(_dec_fixed_bits, out, int(nbits)) if n else out
        nb = np.ascontiguousarray(nbits, dtype=np.int64)
        if not len(nb):
            return np.zeros(0, dtype=np.int64)
        self.require(0, int(nb.sum()))
        return self.run(_dec_bits, nb)

    def finish(self) -> None:
        """Every word consumed and the state back where the encoder started: nothing unaccounted."""
        if self.pos != len(self.words):
            raise TrailingBytes(f"entropy-coded section has {len(self.words) - self.pos} words after the last symbol")
        if self.x != STATE_LOW:
            raise MalformedPayload("entropy-coded section does not end in the encoder's initial state")


# -- the model tables a payload carries -------------------------------------------------------


def write_histograms(w: Writer, keys: np.ndarray, counts: np.ndarray) -> None:
    """Model tables: varint models; per model: varint key delta, varint symbols, per symbol
    varint symbol delta and varint count. Keys ascending; rows of `counts` are histograms."""
    w.varint(len(keys))
    prev = -1
    for key, row in zip(keys.tolist(), counts, strict=True):
        w.varint(key - prev - 1)
        prev = key
        nz = np.flatnonzero(row)
        w.varint(len(nz))
        prev_sym = -1
        for s in nz.tolist():
            w.varint(s - prev_sym - 1)
            w.varint(int(row[s]))
            prev_sym = s


def read_histograms(
    r: Reader, *, max_key: int, alphabet: int, max_count: int, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `write_histograms`: keys (ascending, <= max_key) and (models, alphabet) counts."""
    n = r.varint(max_key + 1, f"{what} count")
    keys = np.zeros(n, dtype=np.int64)
    counts = np.zeros((n, alphabet), dtype=np.int64)
    key = -1
    for i in range(n):
        key += 1 + r.varint(max_key + 1, f"{what} key delta")
        if key > max_key:
            raise MalformedPayload(f"{what} key {key} out of range")
        keys[i] = key
        sym = -1
        for _ in range(r.varint(alphabet, f"{what} symbols")):
            sym += 1 + r.varint(alphabet, f"{what} symbol delta")
            if sym >= alphabet:
                raise MalformedPayload(f"{what} {key}: symbol {sym} out of range")
            counts[i, sym] = r.varint(max_count, f"{what} symbol count")
    return keys, counts
