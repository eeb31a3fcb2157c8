"""PULSELoCo: send a pseudo-gradient only where it would change the BF16 forward pass.

Per tensor, with W the BF16 global weights, Delta the FP32 pseudo-gradient, e the FP32 buffer:

    s = e + Delta
    mask = bf16(W - s) != W                 # compute-visible gating, elementwise
    send v = s[mask] (FP32, or rounded to BF16);  e_new = s - v at the mask, s elsewhere

invariant (exact, in real arithmetic): v + e_new == s everywhere. For BF16 values s - v is exact
in FP32 (Sterbenz: v is s rounded to 8 significant bits, so both have the same sign and are
within a factor 2), so nothing is lost, only delayed.

The receiver knows W, so positions are coded as gaps between ranks within W's exponent classes
(contexts.py, positions.py) and values as sign + exponent relative to W's exponent plus raw
mantissa bits (floatcode.py), both with rANS (ans.py). BF16 values are the default: in
`pulse bench loco` fine-tuning they cost 11.5 bits per sent value all in against 27.5 for FP32
values, 2.4x fewer bytes, with the same final loss to 4 decimals; the rounding residual waits in
e and is sent later.

Format v2 (after the common header of codec.py), varints are LEB128:

    u8 value format (0 FP32, 1 BF16)
    per tensor, sorted by name: class table (positions.write_table: per class its context,
        its count k and its gap code, 0 = every position of the class is sent)
    value models, one per W exponent that occurs (floatcode.write_models)
    varint words | u16 words    positions stream: gaps, class-major
    varint words | u16 words    values stream
Version 1 (constriction's coder) is refused as unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from protocol import floatcode, positions
from protocol.ans import AnsDecoder, AnsEncoder, require
from protocol.codec import Codec, CodecStats, State, numel, read_words, require_finite, write_words
from protocol.contexts import check_full_classes, locate, marked_ranks
from protocol.errors import InvalidPositions, MalformedPayload
from protocol.tensorbytes import bits, dtype_name
from protocol.wire import Reader, Writer

VALUE_FORMATS = {"fp32": (0, floatcode.FP32_MANTISSA), "bf16": (1, floatcode.BF16_MANTISSA)}
_MANTISSA_BY_CODE = {code: mant for code, mant in VALUE_FORMATS.values()}


def gate(weights: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(n,) bool: where bf16(W - s) differs from W (in W's own dtype), i.e. where sending s is visible."""
    w = weights.reshape(-1)
    return (w.float() - s.reshape(-1)).to(w.dtype) != w


@dataclass
class _Part:
    """One tensor's sparse part, positions in class-major order."""

    table: positions.ClassTable  # which exponent classes hold sent positions, how many, their gap codes
    gaps: np.ndarray  # per sent position, class-major
    ctx: np.ndarray  # W's exponent per sent position
    values: np.ndarray  # FP32 value per sent position


class PulseLoCoCodec(Codec):
    name = "pulseloco"
    magic = b"PLOC"
    version = 2

    def __init__(self, value_format: str = "bf16") -> None:
        if value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format must be one of {sorted(VALUE_FORMATS)}, got {value_format!r}")
        self.value_format = value_format

    def _encode(
        self, w: Writer, delta: State, error: State, weights: State
    ) -> tuple[dict[str, torch.Tensor], CodecStats]:
        code, mantissa_bits = VALUE_FORMATS[self.value_format]
        w.u8(code)
        new_error: dict[str, torch.Tensor] = {}
        parts = []
        for name in sorted(weights):
            part, new_error[name] = self._sparsify(weights[name], error[name] + delta[name])
            positions.write_table(w, part.table)
            parts.append(part)
        values = np.concatenate([p.values for p in parts])
        ctx = np.concatenate([p.ctx for p in parts])
        coded = floatcode.split(values, ctx, mantissa_bits)
        before_model = len(w.getvalue())
        floatcode.write_models(w, coded.models)
        model_bytes = len(w.getvalue()) - before_model
        pos_enc = AnsEncoder()
        positions.encode_gaps(
            pos_enc, np.concatenate([p.gaps for p in parts]), positions.per_position([p.table for p in parts])
        )
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
            position_bytes=2 * pos_words.size,
            value_bytes=2 * val_words.size + model_bytes,
        )
        return new_error, stats

    def _sparsify(self, weights: torch.Tensor, s: torch.Tensor) -> tuple[_Part, torch.Tensor]:
        """Gate s against W; the part to send (class-major) and the new buffer."""
        flat = s.reshape(-1)
        require_finite("pulseloco", flat)
        mask = gate(weights, flat).cpu().numpy()
        pos, cls, rank, counts = marked_ranks(bits(weights), mask, dtype_name(weights.dtype))
        order = np.argsort(cls, kind="stable")  # class-major; ranks stay ascending inside a class
        pos, cls, rank = pos[order], cls[order], rank[order]
        first = np.ones(len(cls), dtype=bool)
        first[1:] = cls[1:] != cls[:-1]
        gaps = rank - np.where(first, -1, np.concatenate(([0], rank[:-1]))) - 1
        k_all = np.bincount(cls, minlength=len(counts))
        codes, _ = positions.choose_codes(cls, gaps, counts, k_all)
        classes = np.flatnonzero(k_all)
        table = positions.ClassTable(classes, k_all[classes], codes[classes])
        index = torch.from_numpy(pos).to(flat.device)
        sent = flat[index]
        if self.value_format == "bf16":
            sent = sent.to(torch.bfloat16).float()
        e_new = flat.clone()
        e_new[index] = flat[index] - sent  # exact: see the invariant
        part = _Part(table, gaps, cls.astype(np.uint8), sent.cpu().numpy())
        return part, e_new.reshape(s.shape)

    def _decode(self, r: Reader, weights: State) -> dict[str, torch.Tensor]:
        code = r.u8()
        if code not in _MANTISSA_BY_CODE:
            raise MalformedPayload(f"unknown value format {code}")
        names = sorted(weights)
        tables = [positions.read_table(r, name, weights[name].numel()) for name in names]
        models = floatcode.read_models(r, sum(t.total for t in tables))
        pos_words, val_words = read_words(r), read_words(r)
        r.expect_end()
        total = sum(t.total for t in tables)  # what the streams must carry, before anything of that size
        require(pos_words, *positions.coded_cost(tables), "positions stream")
        require(val_words, total, total * _MANTISSA_BY_CODE[code], "values stream")
        pos_by_tensor = _decode_positions(pos_words, weights, names, tables)
        dec = AnsDecoder(val_words)
        ctx = np.concatenate([np.zeros(0, np.uint8)] + [np.repeat(t.classes, t.k) for t in tables])
        values = floatcode.decode(dec, ctx, models, _MANTISSA_BY_CODE[code])
        dec.finish()
        out, offset = {}, 0
        for name, pos in zip(names, pos_by_tensor, strict=True):
            flat = np.zeros(weights[name].numel(), dtype=np.float32)
            flat[pos] = values[offset : offset + len(pos)]  # finite: floatcode.decode refuses inf/NaN
            offset += len(pos)
            out[name] = torch.from_numpy(flat).reshape(weights[name].shape)
        return out


def _decode_positions(
    words: np.ndarray, weights: State, names: list[str], tables: list[positions.ClassTable]
) -> list[np.ndarray]:
    """Sent positions per tensor, class-major (the order values come in)."""
    dec = AnsDecoder(words)
    gaps = positions.decode_gaps(dec, positions.per_position(tables))
    dec.finish()
    out, offset = [], 0
    for name, table in zip(names, tables, strict=True):
        mine = gaps[offset : offset + table.total]
        offset += table.total
        if np.any(mine >= weights[name].numel()):  # bounds every sum of gaps below
            raise InvalidPositions(f"{name}: a position gap is larger than the tensor")
        if not table.total:
            out.append(mine)
            continue
        w = weights[name]
        raw = bits(w)
        ranks = positions.ranks_from_gaps(mine, table.k)
        pos, counts = locate(raw, dtype_name(w.dtype), table.classes, table.k, ranks)
        check_full_classes(name, table.classes, table.k, table.code == positions.FULL, counts)
        out.append(pos)
    return out
