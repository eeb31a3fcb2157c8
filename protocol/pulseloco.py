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

import functools
from dataclasses import dataclass

import numpy as np
import torch

from protocol import changes, floatcode, positions, tensorbytes
from protocol.ans import AnsDecoder, AnsEncoder, require
from protocol.codec import (
    Codec,
    CodecStats,
    State,
    carried_sum,
    f32_zeros,
    numel,
    read_words,
    require_finite,
    write_words,
)
from protocol.contexts import EXPONENT, NUM_CONTEXTS, check_full_classes, class_counts, place, take_class_major
from protocol.errors import InvalidPositions, MalformedPayload
from protocol.parallel import parallel_map
from protocol.tensorbytes import bits, dtype_name
from protocol.wire import Reader, Writer

VALUE_FORMATS = {"fp32": (0, floatcode.FP32_MANTISSA), "bf16": (1, floatcode.BF16_MANTISSA)}
_MANTISSA_BY_CODE = {code: mant for code, mant in VALUE_FORMATS.values()}


GATE_CHUNK = 1 << 22  # elements: the gate's FP32 temporaries are of one chunk (16 MiB), not of a whole embedding


def gate(weights: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(n,) bool: where bf16(W - s) differs from W (in W's own dtype), i.e. where sending s is visible.
    Chunk by chunk: whole-tensor FP32 temporaries of W and W - s would be 8 bytes per element of the
    largest tensor (1.1 GB for a 0.5B model's embedding) on top of s."""
    w, flat = weights.reshape(-1), s.reshape(-1)
    out = torch.empty(w.shape, dtype=torch.bool, device=w.device)
    for at in range(0, w.numel(), GATE_CHUNK):
        part = w[at : at + GATE_CHUNK]
        out[at : at + GATE_CHUNK] = (part.float() - flat[at : at + GATE_CHUNK]).to(w.dtype) != part
    return out


def largest(mask: torch.Tensor, s: torch.Tensor, fraction: float) -> torch.Tensor:
    """`mask` narrowed to its `fraction` (rounded up) of largest |s|: a smaller payload, the rest kept
    in the buffer. Any subset of the gated positions is a valid payload, so receivers need no rule.
    Tensor ops where the tensors are."""
    where = torch.nonzero(mask).flatten()
    keep = int(np.ceil(fraction * where.numel()))
    if keep >= where.numel():
        return mask
    top = torch.topk(s.reshape(-1)[where].abs(), keep).indices
    narrowed = torch.zeros_like(mask)
    narrowed[where[top]] = True
    return narrowed


@dataclass
class _Part:
    """One tensor's sparse part, positions in class-major order, its values already split for coding
    (symbol and mantissa: as many bytes as the FP32 values, which are dropped per tensor, never held
    whole beside the split)."""

    table: positions.ClassTable  # which exponent classes hold sent positions, how many, their gap codes
    gaps: np.ndarray  # per sent position, class-major
    coded: floatcode.Coded  # per sent position: W's exponent (ctx), symbol, mantissa; with their counts


_INT_VIEW = {2: torch.int16, 4: torch.int32}


def _part(gaps: np.ndarray, values: np.ndarray, counts: np.ndarray, k_all: np.ndarray, mantissa_bits: int) -> _Part:
    """A tensor's part from its class-major gaps and values, class sizes and sent counts per class."""
    codes, _ = positions.choose_codes(None, gaps, counts, k_all)
    classes = np.flatnonzero(k_all)
    table = positions.ClassTable(classes, k_all[classes], codes[classes])
    ctx = np.repeat(classes, k_all[classes]).astype(np.uint8)
    return _Part(table, gaps, floatcode.split(values, ctx, mantissa_bits))


def _gather(parts: list[_Part]) -> tuple[np.ndarray, floatcode.Coded]:
    """Every part's gaps and split values end to end (one value model per context over all of them).
    Each part's arrays are released once copied (the parts are spent), so the peak is the whole plus
    one tensor's part, not the whole twice."""
    n = sum(len(p.gaps) for p in parts)
    gap_dtype = np.result_type(*(p.gaps.dtype for p in parts)) if parts else np.int32
    sym_dtype = parts[0].coded.sym.dtype if parts else np.int16
    mant_dtype = parts[0].coded.mantissa.dtype if parts else np.uint16
    gaps, ctx = np.empty(n, gap_dtype), np.empty(n, np.uint8)
    sym, mantissa = np.empty(n, sym_dtype), np.empty(n, mant_dtype)
    counts = np.zeros((floatcode.CONTEXTS, floatcode.ALPHABET), np.int64)
    at = 0
    for p in parts:
        end, c = at + len(p.gaps), p.coded
        gaps[at:end], ctx[at:end], sym[at:end], mantissa[at:end] = p.gaps, c.ctx, c.sym, c.mantissa
        counts[c.models.keys] += c.models.counts
        p.gaps = c.ctx = c.sym = c.mantissa = _SPENT
        at = end
    keys = np.flatnonzero(counts.sum(axis=1))
    return gaps, floatcode.Coded(sym, mantissa, ctx, floatcode.Models(keys, counts[keys]))


_SPENT = np.zeros(0, np.uint8)


def _stream(
    which: int, gaps: np.ndarray, groups: tuple[np.ndarray, np.ndarray], coded: floatcode.Coded, mantissa_bits: int
) -> np.ndarray:
    """The positions stream (0) or the values stream (1), entropy-coded."""
    enc = AnsEncoder()
    if which == 0:
        positions.encode_gaps(enc, gaps, *groups)
    else:
        floatcode.encode(enc, coded, mantissa_bits)
    return enc.finish()


class PulseLoCoCodec(Codec):
    name = "pulseloco"
    magic = b"PLOC"
    version = 2

    def __init__(self, value_format: str = "bf16") -> None:
        if value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format must be one of {sorted(VALUE_FORMATS)}, got {value_format!r}")
        self.value_format = value_format
        self.format_code, self.mantissa_bits = VALUE_FORMATS[value_format]

    def _encode(
        self, w: Writer, delta: State, error: State, weights: State, fraction: float, error_dtype: torch.dtype
    ) -> tuple[dict[str, torch.Tensor], CodecStats]:
        w.u8(self.format_code)
        names = sorted(weights)

        def sparsify(name: str) -> tuple[_Part, torch.Tensor]:  # the buffer narrowed as soon as it is done
            part, e_new = self._sparsify(weights[name], carried_sum(error[name], delta[name]), fraction)
            return part, e_new.to(error_dtype)

        # tensors gate and sparsify independently (compiled kernels without the GIL): all cores
        done = parallel_map(sparsify, names)
        new_error = {name: e for name, (_, e) in zip(names, done, strict=True)}
        parts = [part for part, _ in done]
        del done
        tables = [part.table for part in parts]
        for table in tables:
            positions.write_table(w, table)
        gaps, coded = _gather(parts)
        sent = len(gaps)
        before_model = len(w.getvalue())
        floatcode.write_models(w, coded.models)
        model_bytes = len(w.getvalue()) - before_model
        groups = positions.table_groups(tables)

        # the two streams are independent: one thread each
        stream = functools.partial(_stream, gaps=gaps, groups=groups, coded=coded, mantissa_bits=self.mantissa_bits)
        pos_words, val_words = parallel_map(stream, [0, 1])
        del stream, gaps, coded  # the streams hold all they say
        stats = CodecStats(
            elements=numel(weights),
            sent=sent,
            payload_bytes=0,
            position_bytes=2 * pos_words.size,
            value_bytes=2 * val_words.size + model_bytes,
        )
        write_words(w, pos_words)
        del pos_words  # the writer's copy is enough: the payload is not held three times at the end
        write_words(w, val_words)
        return new_error, stats

    def _sparsify(self, weights: torch.Tensor, s: torch.Tensor, fraction: float) -> tuple[_Part, torch.Tensor]:
        """Gate s (a buffer this codec owns) against W; the part to send (class-major) and the new
        buffer: s itself, with the sent values taken out of it in one compiled walk."""
        flat = s.reshape(-1)
        require_finite("pulseloco", flat)
        marked = largest(gate(weights, flat), flat, fraction)
        if not tensorbytes.on_host(flat):
            part, e_new = self._sparsify_on_device(weights, flat, marked)
            return part, e_new.reshape(s.shape)
        mask = marked.numpy().view(np.uint8)
        raw = bits(weights)
        shift, emask = EXPONENT[dtype_name(weights.dtype)]
        counts, k_all = class_counts(raw, mask, shift, emask)
        host = flat.numpy()
        offsets = np.zeros(0, np.int32 if len(raw) < 1 << 31 else np.int64)
        gaps, values = take_class_major(raw, mask, host, shift, emask, k_all, self.value_format == "bf16", offsets)
        return _part(gaps, values, counts, k_all, self.mantissa_bits), flat.reshape(s.shape)

    def _sparsify_on_device(
        self, weights: torch.Tensor, flat: torch.Tensor, marked: torch.Tensor
    ) -> tuple[_Part, torch.Tensor]:
        """`_sparsify` as tensor ops where the tensors are (a GPU): classes, ranks, values and the
        buffer update stay there; only the sent entries (gaps, values) cross to the host coder."""
        shift, emask = EXPONENT[dtype_name(weights.dtype)]
        raw = weights.detach().reshape(-1).view(_INT_VIEW[weights.element_size()])
        pos, cls, rank, counts = changes.rank_marked(raw, marked, shift, emask)
        order, gaps = changes.class_major_gaps(cls, rank)
        at = pos[order]
        values = flat[at]
        if self.value_format == "bf16":
            values = values.to(torch.bfloat16).float()  # round to nearest even, as the host walk does
        flat[at] = flat[at] - values  # the buffer is ours: the sent part taken out in place
        k_all = torch.bincount(cls, minlength=NUM_CONTEXTS).cpu().numpy()
        gap_dtype = torch.int32 if raw.numel() < 1 << 31 else torch.int64
        host = gaps.to(gap_dtype).cpu().numpy(), values.cpu().numpy(), counts.cpu().numpy()
        return _part(*host, k_all, self.mantissa_bits), flat

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
        require(pos_words, *positions.group_cost(*positions.table_groups(tables)), "positions stream")
        require(val_words, total, total * _MANTISSA_BY_CODE[code], "values stream")
        groups = positions.table_groups(tables)
        mantissa = _MANTISSA_BY_CODE[code]

        def decode_stream(which: int) -> np.ndarray:  # the two streams are independent: one thread each
            if which == 0:
                dec = AnsDecoder(pos_words)
                out = positions.decode_gaps(dec, *groups)
            else:
                dec = AnsDecoder(val_words)
                ctx = np.concatenate(
                    [np.zeros(0, np.uint8)] + [np.repeat(t.classes, t.k).astype(np.uint8) for t in tables]
                )
                out = floatcode.decode(dec, ctx, models, mantissa)  # finite: inf/NaN refused
            dec.finish()
            return out

        gaps, values = parallel_map(decode_stream, [0, 1])  # a positions error is raised first, as before
        ends = np.cumsum([t.total for t in tables])
        jobs = [
            (name, table, int(end) - table.total, int(end))
            for name, table, end in zip(names, tables, ends, strict=True)
        ]

        def place_tensor(job: tuple[str, positions.ClassTable, int, int]) -> torch.Tensor:
            name, table, start, end = job
            w = weights[name]
            if not tensorbytes.on_host(w):
                return _place_on_device(name, w, table, gaps[start:end], values[start:end])
            flat = np.zeros(w.numel(), dtype=np.float32)
            if table.total:
                k = np.zeros(NUM_CONTEXTS, np.int64)
                k[table.classes] = table.k
                shift, emask = EXPONENT[dtype_name(w.dtype)]
                counts, ok = place(bits(w), shift, emask, k, gaps[start:end], values[start:end], flat)
                if not ok:
                    raise InvalidPositions(f"{name}: a rank is past the end of its exponent class")
                check_full_classes(name, table.classes, table.k, table.code == positions.FULL, counts)
            return torch.from_numpy(flat).reshape(w.shape)

        # tensors place independently (a compiled walk without the GIL); errors come in name order
        return dict(zip(names, parallel_map(place_tensor, jobs), strict=True))


def _place_on_device(
    name: str, w: torch.Tensor, table: positions.ClassTable, gaps: np.ndarray, values: np.ndarray
) -> torch.Tensor:
    """A tensor's dense update from its class-major gaps and values, as tensor ops where `w` is:
    ranks by a cumulative sum within each class, positions by `changes.positions_of`; the same
    refusals as the host walk (a rank past its class, a fully-sent flag that does not hold)."""
    out = f32_zeros(w.numel(), w.device)
    if not table.total:
        return out.reshape(w.shape)
    g = torch.from_numpy(gaps.astype(np.int64)).to(w.device)
    if int(g.max()) >= w.numel():  # no class is that large; also keeps the sums below from overflowing
        raise InvalidPositions(f"{name}: a rank is past the end of its exponent class")
    k = torch.from_numpy(table.k.astype(np.int64)).to(w.device)
    cls = torch.repeat_interleave(torch.from_numpy(table.classes.astype(np.int64)).to(w.device), k)
    steps = torch.cumsum(g + 1, 0)
    before = torch.repeat_interleave(torch.cumsum(k, 0) - k, k)  # index of each class's first entry
    rank = steps - torch.cat([steps.new_zeros(1), steps])[before] - 1
    shift, emask = EXPONENT[dtype_name(w.dtype)]
    raw = w.detach().reshape(-1).view(_INT_VIEW[w.element_size()])
    found = changes.positions_of(raw, cls.to(torch.uint8), rank, shift, emask)
    if found is None:
        raise InvalidPositions(f"{name}: a rank is past the end of its exponent class")
    where, counts = found
    check_full_classes(name, table.classes, table.k, table.code == positions.FULL, counts.cpu().numpy())
    out[where] = torch.from_numpy(values).to(w.device)
    return out.reshape(w.shape)
