"""Changed values coded as the integer difference of bit patterns, modeled per old exponent.

For a changed weight, d = new_bits - old_bits (wrapping at the dtype's width) is small: most
BF16 updates move a weight by one or two ulps. d is zigzag-mapped to z >= 0 (d != 0, so
z = zigzag(d) - 1). Small z are literal symbols; larger z are sent as their bit length plus
the bits below the leading one, uniform. One categorical model per (dtype, old exponent),
whose symbol counts travel in the patch header.
"""

from __future__ import annotations

import numpy as np

from protocol.ans import AnsDecoder, AnsEncoder

LITERALS = 16  # z in 0..15 is its own symbol
ALPHABET = LITERALS + 33 - 5  # then bit lengths 5..32
_WIDTH = {"bfloat16": 16, "float16": 16, "float32": 32}


def to_symbols(old: np.ndarray, new: np.ndarray, dtype: str) -> np.ndarray:
    """z per change (uint64) from old and new bit patterns of changed positions."""
    width = _WIDTH[dtype]
    d = (new.astype(np.int64) - old.astype(np.int64)) & ((1 << width) - 1)
    d = np.where(d >= 1 << (width - 1), d - (1 << width), d)  # signed, in [-2**(w-1), 2**(w-1))
    zig = np.where(d < 0, -2 * d - 1, 2 * d)  # -1 -> 1, 1 -> 2, -2 -> 3, ...
    return (zig - 1).astype(np.uint64)


def from_symbols(old: np.ndarray, z: np.ndarray, dtype: str) -> np.ndarray:
    """New bit patterns from old ones and z (inverse of `to_symbols`)."""
    width = _WIDTH[dtype]
    zig = z.astype(np.int64) + 1
    d = np.where(zig & 1, -((zig + 1) >> 1), zig >> 1)
    return ((old.astype(np.int64) + d) & ((1 << width) - 1)).astype(old.dtype)


def _bit_length(z: np.ndarray) -> np.ndarray:
    out = np.zeros(z.shape, dtype=np.int64)
    v = z.astype(np.uint64)
    for shift in (32, 16, 8, 4, 2, 1):
        big = v >= np.uint64(1 << shift)
        out[big] += shift
        v = np.where(big, v >> np.uint64(shift), v)
    return out + (z > 0)


def split(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(symbol, extra-bit count) per z; extra bits are z below its leading one."""
    sym = z.astype(np.int64)
    nbits = np.zeros(z.shape, dtype=np.int64)
    big = np.flatnonzero(z >= LITERALS)  # rare for optimizer updates: only these need a bit length
    length = _bit_length(z[big])
    sym[big] = LITERALS + length - 5
    nbits[big] = length - 1
    return sym, nbits


def _piece_bits(nbits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bit counts of the high and low pieces of the extra bits (each at most 16)."""
    hi_bits = np.maximum(nbits - 16, 0)
    return hi_bits, nbits - hi_bits


def encode_values(enc: AnsEncoder, z: np.ndarray, model_of: np.ndarray, counts: np.ndarray) -> None:
    """Queue z for every change; `model_of` indexes rows of `counts` (models x ALPHABET)."""
    sym, nbits = split(z)
    for model in range(len(counts)):
        enc.categorical(sym[model_of == model], counts[model])
    extra = np.where(nbits > 0, z.astype(np.int64) - np.left_shift(1, nbits), 0)
    hi_bits, lo_bits = _piece_bits(nbits)
    enc.uniform(extra >> lo_bits, np.left_shift(1, hi_bits))
    enc.uniform(extra & (np.left_shift(1, lo_bits) - 1), np.left_shift(1, lo_bits))


def decode_values(dec: AnsDecoder, model_of: np.ndarray, counts: np.ndarray) -> np.ndarray:
    sym = np.zeros(model_of.shape, dtype=np.int64)
    for model in range(len(counts)):
        where = np.flatnonzero(model_of == model)
        sym[where] = dec.categorical(len(where), counts[model])
    literal = sym < LITERALS
    nbits = np.where(literal, 0, sym - LITERALS + 4)
    hi_bits, lo_bits = _piece_bits(nbits)
    hi = dec.uniform(np.left_shift(1, hi_bits))
    lo = dec.uniform(np.left_shift(1, lo_bits))
    extra = (hi << lo_bits) | lo
    return np.where(literal, sym, np.left_shift(1, nbits) + extra).astype(np.uint64)


def histogram(sym: np.ndarray) -> np.ndarray:
    return np.bincount(sym, minlength=ALPHABET).astype(np.int64)


def entropy_bits(counts: np.ndarray) -> float:
    """Empirical order-0 entropy of a histogram, in bits in total."""
    total = int(counts.sum())
    nz = counts[counts > 0]
    return float(-(nz * np.log2(nz / total)).sum()) if total else 0.0
