"""PULSELoCo: send a pseudo-gradient only where it would change the BF16 forward pass.

Per tensor, with W the BF16 global weights, Delta the FP32 pseudo-gradient, e the FP32 buffer:

    s = e + Delta
    mask = bf16(W - s) != W                 # compute-visible gating, elementwise
    send v = s[mask] (FP32, or rounded to BF16);  e_new = s - v at the mask, s elsewhere

invariant (exact, in real arithmetic): v + e_new == s everywhere. For BF16 values s - v is exact
in FP32 (Sterbenz: v is s rounded to 8 significant bits, so both have the same sign and are
within a factor 2), so nothing is lost, only delayed.

The receiver knows W, so positions are coded as gaps within W's exponent classes
(contexts.py, positions.py) and values as sign + exponent relative to W's exponent plus raw
mantissa bits (floatcode.py). BF16 values are the default: in `pulse bench loco` fine-tuning they
cost 11.5 bits per sent value all in against 27.5 for FP32 values, 2.4x fewer bytes, with the
same final loss to 4 decimals; the rounding residual waits in e and is sent later.

Format v1 (after the common header of codec.py), varints are LEB128:

    u8 value format (0 FP32, 1 BF16)
    per tensor, sorted by name: varint classes, per class: varint context delta, varint k,
        u8 theta (0 = every position of the class is sent)
    value models, one per W exponent that occurs (floatcode.write_models)
    varint words | u32 words    positions stream
    varint words | u32 words    values stream
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from protocol import floatcode, positions
from protocol.ans import AnsDecoder, AnsEncoder
from protocol.codec import Codec, CodecStats, State, check_gaps, f32_tensor, numel, read_words, write_words
from protocol.contexts import ContextOrder, exponent_context
from protocol.errors import MalformedPayload
from protocol.tensorbytes import bits, dtype_name
from protocol.wire import Reader, Writer

VALUE_FORMATS = {"fp32": (0, floatcode.FP32_MANTISSA), "bf16": (1, floatcode.BF16_MANTISSA)}
_MANTISSA_BY_CODE = {code: mant for code, mant in VALUE_FORMATS.values()}


def gate(weights: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(n,) bool: where bf16(W - s) differs from W (in W's own dtype), i.e. where sending s is visible."""
    w = weights.reshape(-1)
    return (w.float() - s.reshape(-1)).to(w.dtype) != w


def largest(mask: np.ndarray, s: torch.Tensor, fraction: float) -> np.ndarray:
    """`mask` narrowed to its `fraction` (rounded up) of largest |s|: a smaller payload, the rest kept
    in the buffer. Any subset of the gated positions is a valid payload, so receivers need no rule."""
    where = np.flatnonzero(mask)
    keep = int(np.ceil(fraction * where.size))
    if keep >= where.size:
        return mask
    magnitude = s.abs().numpy()[where]
    narrowed = np.zeros_like(mask)
    narrowed[where[np.argpartition(magnitude, where.size - keep)[where.size - keep :]]] = True
    return narrowed


@dataclass
class _Part:
    """One tensor's sparse part, positions in class-major order."""

    table: positions.ClassTable  # which exponent classes hold sent positions, and how many
    gaps: np.ndarray  # per sent position, class-major
    ctx: np.ndarray  # W's exponent per sent position
    values: np.ndarray  # FP32 value per sent position


class PulseLoCoCodec(Codec):
    name = "pulseloco"
    magic = b"PLOC"
    version = 1

    def __init__(self, value_format: str = "bf16") -> None:
        if value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format must be one of {sorted(VALUE_FORMATS)}, got {value_format!r}")
        self.value_format = value_format

    def _encode(
        self, w: Writer, delta: State, error: State, weights: State, fraction: float
    ) -> tuple[dict[str, torch.Tensor], CodecStats]:
        code, mantissa_bits = VALUE_FORMATS[self.value_format]
        w.u8(code)
        new_error: dict[str, torch.Tensor] = {}
        parts = []
        for name in sorted(weights):
            part, new_error[name] = self._sparsify(weights[name], error[name] + delta[name], fraction)
            positions.write_table(w, part.table)
            parts.append(part)
        values = np.concatenate([p.values for p in parts])
        ctx = np.concatenate([p.ctx for p in parts])
        coded = floatcode.split(values, ctx, mantissa_bits)
        before_model = len(w.getvalue())
        floatcode.write_models(w, coded.models)
        model_bytes = len(w.getvalue()) - before_model
        pos_enc = AnsEncoder()
        positions.encode_tables(pos_enc, [p.table for p in parts], [p.gaps for p in parts])
        pos_words = pos_enc.finish()
        val_enc = AnsEncoder()
        floatcode.encode(val_enc, coded, mantissa_bits)
        val_words = val_enc.finish()
        write_words(w, pos_words)
        write_words(w, val_words)
        stats = CodecStats(
            elements=numel(weights),
            sent=len(values),
            payload_bytes=0,
            position_bytes=4 * pos_words.size,
            value_bytes=4 * val_words.size + model_bytes,
        )
        return new_error, stats

    def _sparsify(self, weights: torch.Tensor, s: torch.Tensor, fraction: float) -> tuple[_Part, torch.Tensor]:
        """Gate s against W; the part to send (class-major) and the new buffer."""
        flat = s.reshape(-1)
        mask = largest(gate(weights, flat).numpy(), flat, fraction)
        raw = bits(weights)
        ctx = exponent_context(raw, dtype_name(weights.dtype))
        order = ContextOrder(ctx)
        sidx = order.sorted_indices(mask)
        pos = order.positions(sidx)
        sent = flat[torch.from_numpy(pos)]
        if self.value_format == "bf16":
            sent = sent.to(torch.bfloat16).float()
        e_new = flat.clone()
        e_new[torch.from_numpy(pos)] = flat[torch.from_numpy(pos)] - sent  # exact: see the invariant
        table, gaps = positions.build_table(sidx, order.starts, order.counts)
        part = _Part(table, gaps, ctx[pos], sent.numpy())
        return part, e_new.reshape(s.shape)

    def _decode(self, r: Reader, weights: State) -> dict[str, torch.Tensor]:
        code = r.u8()
        if code not in _MANTISSA_BY_CODE:
            raise MalformedPayload(f"unknown value format {code}")
        names = sorted(weights)
        headers = [positions.read_table(r, name, weights[name].numel()) for name in names]
        models = floatcode.read_models(r, sum(int(k.sum()) for _, k, _ in headers))
        pos_words, val_words = read_words(r), read_words(r)
        r.expect_end()
        tensors = [_Tensor.check(name, weights[name], *h) for name, h in zip(names, headers, strict=True)]
        pos_by_tensor = _decode_positions(pos_words, tensors)
        dec = AnsDecoder(val_words)
        ctx = np.concatenate([np.zeros(0, np.uint8)] + [t.ctx[p] for t, p in zip(tensors, pos_by_tensor, strict=True)])
        values = floatcode.decode(dec, ctx, models, _MANTISSA_BY_CODE[code])
        dec.finish()
        out, offset = {}, 0
        for name, pos in zip(names, pos_by_tensor, strict=True):
            flat = np.zeros(weights[name].numel(), dtype=np.float32)
            flat[pos] = values[offset : offset + len(pos)]
            offset += len(pos)
            out[name] = f32_tensor(flat, weights[name], name)
        return out


@dataclass
class _Tensor:
    """One tensor as the receiver sees it: W's exponent classes and what the header claims about them."""

    ctx: np.ndarray  # (numel,) uint8 exponent of W
    order: ContextOrder
    table: positions.ClassTable

    @classmethod
    def check(cls, name: str, weights: torch.Tensor, classes: np.ndarray, k: np.ndarray, theta: np.ndarray) -> _Tensor:
        ctx = exponent_context(bits(weights), dtype_name(weights.dtype))
        order = ContextOrder(ctx)
        return cls(ctx, order, positions.check_table(name, classes, k, theta, order.counts))


def _decode_positions(words: np.ndarray, tensors: list[_Tensor]) -> list[np.ndarray]:
    """Sent positions per tensor, class-major (the order values come in)."""
    cat = lambda arrays: np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)  # noqa: E731
    tables = [t.table for t in tensors]
    k, n = cat([t.k for t in tables]), cat([t.n for t in tables])
    dec = AnsDecoder(words)
    gaps = positions.decode_tables(dec, tables)
    dec.finish()
    check_gaps(gaps, np.repeat(n, k))
    out, offset = [], 0
    for t in tensors:
        total = int(t.table.k.sum())
        sidx = (
            positions.join_gaps(gaps[offset : offset + total], t.order.starts[t.table.classes], t.table.n, t.table.k)
            if total
            else gaps[:0]
        )
        out.append(t.order.positions(sidx))
        offset += total
    return out
