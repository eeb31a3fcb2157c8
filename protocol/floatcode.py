"""Entropy coding of FP32 values whose magnitude the receiver can predict from a context exponent.

A value is split into a symbol and raw mantissa bits (ans.py codes both). The symbol is the sign and the distance
`d = (ctx - exponent) mod 256` from a context exponent both ends know (PULSELoCo: the exponent of
the BF16 weight, since a value is sent only when it is about half that weight's ulp or more). There
is one categorical model per context, whose counts travel in the payload; on PULSELoCo fine-tuning
updates this costs ~1.7 bits per value where one shared model costs ~2.5. The mantissa is uniform:
23 bits for FP32 values, 7 for values already rounded to BF16 (their low 16 bits are zero).

    sym = sign * 256 + (ctx - exponent) mod 256         # ALPHABET = 512 symbols
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from protocol import ans
from protocol.ans import AnsDecoder, AnsEncoder, read_histograms, write_histograms
from protocol.errors import MalformedPayload, NonFiniteValues
from protocol.wire import Reader, Writer

ALPHABET = 512
CONTEXTS = 256
_jit = numba.njit(nogil=True, cache=True)
FP32_MANTISSA, BF16_MANTISSA = 23, 7


@dataclass
class Models:
    """One symbol histogram per context that occurs, contexts ascending."""

    keys: np.ndarray  # (models,) context values
    counts: np.ndarray  # (models, ALPHABET)


@dataclass
class Coded:
    """Values split for coding, in their original order."""

    sym: np.ndarray
    mantissa: np.ndarray
    ctx: np.ndarray
    models: Models


@_jit
def _split(
    raw: np.ndarray, ctx: np.ndarray, dropped: int, mantissa: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(symbol, mantissa, (CONTEXTS x ALPHABET) counts, status) of FP32 bit patterns, the mantissas
    written into `mantissa` (the caller's, as narrow as the kept bits allow); status 1 for inf/NaN,
    2 for mantissa bits below the kept ones."""
    n = len(raw)
    sym = np.empty(n, np.int16)
    counts = np.zeros((CONTEXTS, ALPHABET), np.int64)
    for i in range(n):
        u = np.int64(raw[i])
        exponent = (u >> 23) & 0xFF
        if exponent == 0xFF:
            return sym, mantissa, counts, 1
        if u & ((1 << dropped) - 1):
            return sym, mantissa, counts, 2
        c = np.int64(ctx[i])
        s = (u >> 31) * 256 + ((c - exponent) & 0xFF)
        sym[i] = s
        mantissa[i] = (u & 0x7FFFFF) >> dropped
        counts[c, s] += 1
    return sym, mantissa, counts, 0


@_jit
def _context_runs(ctx: np.ndarray, row_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(model row, length) of each run of values sharing a context."""
    n_runs = 1 if len(ctx) else 0
    for i in range(1, len(ctx)):
        n_runs += ctx[i] != ctx[i - 1]
    rows, lengths = np.empty(n_runs, np.int64), np.zeros(n_runs, np.int64)
    r = -1
    for i in range(len(ctx)):
        if i == 0 or ctx[i] != ctx[i - 1]:
            r += 1
            rows[r] = row_of[ctx[i]]
        lengths[r] += 1
    return rows, lengths


@_jit
def _assemble(ctx: np.ndarray, sym: np.ndarray, mantissa: np.ndarray, dropped: int) -> tuple[np.ndarray, bool]:
    """FP32 values from their parts; False if one would be inf or NaN."""
    out = np.empty(len(ctx), np.uint32)
    for i in range(len(ctx)):
        s = np.int64(sym[i])
        exponent = (np.int64(ctx[i]) - (s & 0xFF)) & 0xFF
        if exponent == 0xFF:
            return out.view(np.float32), False
        out[i] = ((s >> 8) << 31) | (exponent << 23) | (np.int64(mantissa[i]) << dropped)
    return out.view(np.float32), True


def split(values: np.ndarray, ctx: np.ndarray, mantissa_bits: int) -> Coded:
    """Symbols, mantissas and per-context models of finite FP32 `values` (ctx: uint8 per value)."""
    raw = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    # BF16's 7 kept bits in 2 bytes a value, not 4: a miner codes hundreds of millions of them at once
    mantissa_out = np.empty(len(raw), np.uint16 if mantissa_bits <= 16 else np.int32)
    ctx = np.ascontiguousarray(ctx, dtype=np.uint8)
    sym, mantissa, counts, status = _split(raw, ctx, 23 - mantissa_bits, mantissa_out)
    if status == 1:
        raise ValueError("only finite values can be coded")
    if status == 2:
        raise ValueError(f"values have mantissa bits below the {mantissa_bits} this format keeps")
    keys = np.flatnonzero(counts.sum(axis=1))
    return Coded(sym, mantissa, ctx, Models(keys, counts[keys]))


def _rows(keys: np.ndarray) -> np.ndarray:
    row_of = np.full(CONTEXTS, -1, np.int64)
    row_of[keys] = np.arange(len(keys))
    return row_of


def write_models(w: Writer, models: Models) -> None:
    """One histogram per context, in the shared table format (`ans.write_histograms`)."""
    write_histograms(w, models.keys, models.counts)


def read_models(r: Reader, total: int) -> Models:
    """Inverse of `write_models`; counts are bounded by `total`, the number of values."""
    keys, counts = read_histograms(r, max_key=CONTEXTS - 1, alphabet=ALPHABET, max_count=total, what="value model")
    return Models(keys, counts)


def encode(enc: AnsEncoder, coded: Coded, mantissa_bits: int) -> None:
    """Queue symbols (each under its context's model) and then mantissas, in decode order."""
    runs = _context_runs(coded.ctx, _rows(coded.models.keys))
    enc.categorical(coded.sym, ans.Models.from_counts(coded.models.counts), runs=runs)
    enc.bits(coded.mantissa, mantissa_bits)


def decode(dec: AnsDecoder, ctx: np.ndarray, models: Models, mantissa_bits: int) -> np.ndarray:
    """FP32 values for the contexts `ctx` (uint8, known to the receiver); each context's model must
    count exactly its values. Raises NonFiniteValues for an inf/NaN exponent."""
    ctx = np.ascontiguousarray(ctx, dtype=np.uint8)
    n = len(ctx)
    dec.require(n, n * mantissa_bits, "value stream")  # before any work: a short stream cannot hold them
    per_ctx = np.bincount(ctx, minlength=CONTEXTS)
    present = np.flatnonzero(per_ctx)
    if not np.array_equal(present, models.keys) or not np.array_equal(per_ctx[present], models.counts.sum(axis=1)):
        raise MalformedPayload("value models do not match the contexts of the sent positions")
    row_of = _rows(models.keys)
    sym = dec.categorical(ans.Models.from_counts(models.counts), runs=_context_runs(ctx, row_of))
    seen = _symbol_counts(ctx, sym, row_of, len(models.keys))
    if not np.array_equal(seen, models.counts):
        raise MalformedPayload("decoded value symbols disagree with their models")
    mantissa = dec.bits(mantissa_bits, n)
    values, finite = _assemble(ctx, sym, mantissa, 23 - mantissa_bits)
    if not finite:
        raise NonFiniteValues("a value decodes to inf or NaN")
    return values


@_jit
def _symbol_counts(ctx: np.ndarray, sym: np.ndarray, row_of: np.ndarray, models: int) -> np.ndarray:
    counts = np.zeros((models, ALPHABET), np.int64)
    for i in range(len(ctx)):
        counts[row_of[ctx[i]], sym[i]] += 1
    return counts
