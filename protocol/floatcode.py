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

import numpy as np

from protocol import ans
from protocol.ans import AnsDecoder, AnsEncoder, read_histograms, write_histograms
from protocol.errors import MalformedPayload, NonFiniteValues
from protocol.wire import Reader, Writer

ALPHABET = 512
CONTEXTS = 256
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


def split(values: np.ndarray, ctx: np.ndarray, mantissa_bits: int) -> Coded:
    """Symbols, mantissas and per-context models of finite FP32 `values` (ctx: uint8 per value)."""
    raw = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.int64)
    exponent = (raw >> 23) & 0xFF
    if np.any(exponent == 0xFF):
        raise ValueError("only finite values can be coded")
    dropped = 23 - mantissa_bits
    if dropped and np.any(raw & ((1 << dropped) - 1)):
        raise ValueError(f"values have mantissa bits below the {mantissa_bits} this format keeps")
    ctx = ctx.astype(np.int64)
    sym = (raw >> 31) * 256 + ((ctx - exponent) & 0xFF)
    keys, model_of = np.unique(ctx, return_inverse=True)
    counts = np.bincount(model_of * ALPHABET + sym, minlength=len(keys) * ALPHABET).reshape(len(keys), ALPHABET)
    return Coded(sym, (raw & 0x7FFFFF) >> dropped, ctx, Models(keys, counts.astype(np.int64)))


def write_models(w: Writer, models: Models) -> None:
    """One histogram per context, in the shared table format (`ans.write_histograms`)."""
    write_histograms(w, models.keys, models.counts)


def read_models(r: Reader, total: int) -> Models:
    """Inverse of `write_models`; counts are bounded by `total`, the number of values."""
    keys, counts = read_histograms(r, max_key=CONTEXTS - 1, alphabet=ALPHABET, max_count=total, what="value model")
    return Models(keys, counts)


def encode(enc: AnsEncoder, coded: Coded, mantissa_bits: int) -> None:
    """Queue symbols (each under its context's model) and then mantissas, in decode order."""
    model_of = np.searchsorted(coded.models.keys, coded.ctx)
    enc.categorical(coded.sym, ans.Models.from_counts(coded.models.counts), model_of)
    enc.bits(coded.mantissa, mantissa_bits)


def decode(dec: AnsDecoder, ctx: np.ndarray, models: Models, mantissa_bits: int) -> np.ndarray:
    """FP32 values for the contexts `ctx` (known to the receiver); each context's model must count
    exactly its values. Raises NonFiniteValues for an inf/NaN exponent."""
    ctx = ctx.astype(np.int64)
    n = len(ctx)
    dec.require(n, n * mantissa_bits, "value stream")  # before any work: a short stream cannot hold them
    present, per_ctx = np.unique(ctx, return_counts=True)
    if not np.array_equal(present, models.keys) or not np.array_equal(per_ctx, models.counts.sum(axis=1)):
        raise MalformedPayload("value models do not match the contexts of the sent positions")
    model_of = np.searchsorted(models.keys, ctx)
    sym = dec.categorical(ans.Models.from_counts(models.counts), model_of)
    seen = np.bincount(model_of * ALPHABET + sym, minlength=len(models.keys) * ALPHABET)
    if not np.array_equal(seen, models.counts.reshape(-1)):
        raise MalformedPayload("decoded value symbols disagree with their models")
    mantissa = dec.bits(mantissa_bits, n) << (23 - mantissa_bits)
    exponent = (ctx - (sym & 0xFF)) & 0xFF
    if np.any(exponent == 0xFF):
        raise NonFiniteValues("a value decodes to inf or NaN")
    raw = ((sym >> 8) << 31) | (exponent << 23) | mantissa
    return raw.astype(np.uint32).view(np.float32)
