"""PULSESync: a lossless patch from one state dict to another, for sparse BF16 updates.

    patch = encode(old, new)
    new_again = apply(old, patch)      # bit for bit equal to `new`, or an exception

The receiver already holds `old`, so everything is conditioned on it (contexts.py): positions
are gaps within the old weight's exponent class (positions.py), values are bit-pattern
differences modeled per old exponent (values.py), all in one ANS stream (ans.py). A tensor whose
sparse form would cost more than its dense form is sent dense (zstd of the raw new bytes).

Format v1, little-endian, varints are LEB128 (wire.py):

    "PSYN" u8 version | base state hash (32) | result state hash (32) | varint tensor count
    per tensor, in sorted-name order of the base state:
        u8 dtype code | varint numel | u8 mode (0 same, 1 sparse, 2 dense)
        sparse: varint classes, per class: varint context delta, varint k, u8 theta (0 = all changed)
        dense:  varint compressed length
    varint value models, per model: varint key delta (dtype code * 256 + exponent),
        varint symbols, per symbol: varint symbol delta, varint count
    varint words | u32 words (the ANS stream) | dense sections in tensor order | end

invariant: a patch applies only to the state whose hash it names, and `apply` returns only a
state whose hash is the one the patch names.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import zstandard

from protocol import positions, values
from protocol.ans import AnsDecoder, AnsEncoder, read_histograms, write_histograms
from protocol.contexts import NUM_CONTEXTS, ContextOrder, exponent_context
from protocol.errors import (
    DecompressionBomb,
    IncompatibleStates,
    LayoutMismatch,
    MalformedPayload,
    SizeLimitExceeded,
    StateHashMismatch,
    UnknownVersion,
)
from protocol.parallel import parallel_map
from protocol.state import State
from protocol.statehash import state_hash
from protocol.tensorbytes import bits, dtype_name, from_bits
from protocol.wire import Reader, Writer

MAGIC = b"PSYN"
VERSION = 1
DTYPE_CODES = {"bfloat16": 1, "float16": 2, "float32": 3}
_DTYPE_BY_CODE = {v: k for k, v in DTYPE_CODES.items()}
SAME, SPARSE, DENSE = 0, 1, 2
_HEADER_SLACK = 1 << 16


@dataclass
class PatchStats:
    """What one patch contains, and the information bounds it is measured against."""

    elements: int = 0
    changed: int = 0
    patch_bytes: int = 0
    dense_tensors: int = 0
    position_bound_bits: float = 0.0  # sum over (tensor, exponent) of log2 C(n, k); dense tensors in full
    value_bound_bits: float = 0.0  # empirical entropy per (dtype, exponent) model + uniform extra bits
    order0_position_bits: float = 0.0  # sum over tensors of log2 C(n, k)
    order0_value_bits: float = 0.0  # empirical entropy of the raw bit-pattern differences, one model
    _z_all: list[np.ndarray] = field(default_factory=list, repr=False)


@dataclass
class _Sparse:
    """One tensor's sparse part, as the encoder prepares it."""

    table: positions.ClassTable  # which exponent classes changed, and how many
    gaps: np.ndarray  # per change, class-major
    z: np.ndarray  # value symbol per change
    keys: np.ndarray  # value model key per change
    value_bits: float  # values at their empirical entropy, this tensor alone


def check_layout(old: State, new: State) -> None:
    """Raise IncompatibleStates unless both have the same names, shapes and supported dtypes."""
    if set(old) != set(new):
        missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        raise IncompatibleStates(f"tensor names differ: only in old {missing[:5]}, only in new {extra[:5]}")
    for name in old:
        a, b = old[name], new[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            raise IncompatibleStates(f"{name}: old is {a.dtype}{tuple(a.shape)}, new is {b.dtype}{tuple(b.shape)}")
        dtype_name(a.dtype)  # raises UnsupportedDtype


def encode(old: State, new: State, *, old_hash: str | None = None, new_hash: str | None = None) -> bytes:
    """A patch that turns `old` into `new` exactly. Pass the state hashes if already known."""
    return encode_with_stats(old, new, old_hash=old_hash, new_hash=new_hash)[0]


def encode_with_stats(
    old: State, new: State, *, old_hash: str | None = None, new_hash: str | None = None, zstd_level: int = 1
) -> tuple[bytes, PatchStats]:
    check_layout(old, new)
    stats = PatchStats()
    head = Writer()
    head.raw(MAGIC)
    head.u8(VERSION)
    head.raw(bytes.fromhex(old_hash or state_hash(old)))
    head.raw(bytes.fromhex(new_hash or state_hash(new)))
    head.varint(len(old))
    sparse: list[_Sparse] = []
    dense: list[bytes] = []
    names = sorted(old)
    parts = parallel_map(
        lambda name: _prepare_sparse(bits(old[name]), bits(new[name]), dtype_name(old[name].dtype)), names
    )
    for name, part in zip(names, parts, strict=True):
        dtype = dtype_name(old[name].dtype)
        raw_new = bits(new[name])
        head.u8(DTYPE_CODES[dtype])
        head.varint(raw_new.size)
        stats.elements += raw_new.size
        if part is not None:
            stats.changed += len(part.z)
            stats.order0_position_bits += positions.log2_binomial(raw_new.size, len(part.z))
            stats._z_all.append(part.z)
        if part is None:
            head.u8(SAME)
        elif _sparse_bits_estimate(part) >= 8 * raw_new.nbytes:
            stats.dense_tensors += 1
            dense.append(zstandard.ZstdCompressor(level=zstd_level).compress(raw_new.tobytes()))
            # a dense tensor is modeled as its compressed bytes: they count in full in the bound
            stats.position_bound_bits += 8 * len(dense[-1])
            head.u8(DENSE)
            head.varint(len(dense[-1]))
        else:
            sparse.append(part)
            stats.position_bound_bits += part.table.position_bits
            head.u8(SPARSE)
            positions.write_table(head, part.table)
    stream = _encode_stream(head, sparse, stats)
    head.varint(stream.size)
    head.raw(stream.astype("<u4").tobytes())
    for section in dense:
        head.raw(section)
    patch = head.getvalue()
    stats.patch_bytes = len(patch)
    stats.order0_value_bits = _order0_value_bits(stats._z_all)
    return patch, stats


def _prepare_sparse(raw_old: np.ndarray, raw_new: np.ndarray, dtype: str) -> _Sparse | None:
    mask = raw_old != raw_new
    k_total = int(np.count_nonzero(mask))
    if k_total == 0:
        return None
    ctx = exponent_context(raw_old, dtype)
    order = ContextOrder(ctx)
    sidx = order.sorted_indices(mask)
    table, gaps = positions.build_table(sidx, order.starts, order.counts)
    pos = order.positions(sidx)
    z = values.to_symbols(raw_old[pos], raw_new[pos], dtype)
    keys = DTYPE_CODES[dtype] * NUM_CONTEXTS + ctx[pos].astype(np.int64)
    sym, nbits = values.split(z)
    value_bits = values.entropy_bits(values.histogram(sym)) + float(nbits.sum())
    return _Sparse(table, gaps, z, keys, value_bits)


def _sparse_bits_estimate(part: _Sparse) -> float:
    """Size of the sparse form: its entropy plus the class table (about 3 bytes a class)."""
    return part.table.position_bits + part.value_bits + 24 * len(part.table.classes)


def _encode_stream(head: Writer, sparse: list[_Sparse], stats: PatchStats) -> np.ndarray:
    enc = AnsEncoder()
    if sparse:
        positions.encode_tables(enc, [p.table for p in sparse], [p.gaps for p in sparse])
        z = np.concatenate([p.z for p in sparse])
        keys = np.concatenate([p.keys for p in sparse])
    else:
        z = np.zeros(0, dtype=np.uint64)
        keys = np.zeros(0, dtype=np.int64)
    model_keys, model_of = np.unique(keys, return_inverse=True)
    sym, nbits = values.split(z)
    counts = np.bincount(model_of * values.ALPHABET + sym, minlength=len(model_keys) * values.ALPHABET)
    counts = counts.reshape(len(model_keys), values.ALPHABET)
    write_histograms(head, model_keys, counts)
    values.encode_values(enc, z, model_of, counts)
    stats.value_bound_bits += sum(values.entropy_bits(row) for row in counts) + float(nbits.sum())
    return enc.finish()


def _order0_value_bits(z_parts: list[np.ndarray]) -> float:
    if not z_parts:
        return 0.0
    _, counts = np.unique(np.concatenate(z_parts), return_counts=True)
    return values.entropy_bits(counts)


# -- decoding -------------------------------------------------------------------------------


@dataclass
class _Entry:
    """One tensor as the patch header describes it."""

    name: str
    dtype: str
    mode: int
    classes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    k: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    theta: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    dense_len: int = 0


def default_max_bytes(state: State) -> int:
    """The largest patch worth accepting for `state`: its dense size, plus header slack."""
    return sum(t.numel() * t.element_size() for t in state.values()) * 11 // 10 + _HEADER_SLACK


def apply(old: State, patch: bytes, *, max_bytes: int | None = None) -> dict[str, torch.Tensor]:
    """The state `patch` produces from `old`. `old` is never modified.

    Raises a `ProtocolError` subclass for any patch that is malformed, does not apply to `old`,
    or does not produce the state it names; nothing is returned in that case.
    """
    cap = default_max_bytes(old) if max_bytes is None else max_bytes
    parsed = _parse(old, patch, cap)
    held = state_hash(old)
    if held != parsed.base_hash:
        raise StateHashMismatch(f"patch applies to state {parsed.base_hash[:16]}, this state is {held[:16]}")
    new = _decode_body(old, parsed)
    got = state_hash(new)
    if got != parsed.result_hash:
        raise StateHashMismatch(f"patch should produce state {parsed.result_hash[:16]} but produced {got[:16]}")
    return new


def apply_unverified(old: State, patch: bytes, *, max_bytes: int | None = None) -> dict[str, torch.Tensor]:
    """`apply` without either state hash check: for measuring the codec alone, never for peer bytes."""
    cap = default_max_bytes(old) if max_bytes is None else max_bytes
    return _decode_body(old, _parse(old, patch, cap))


@dataclass
class _Parsed:
    base_hash: str
    result_hash: str
    entries: list[_Entry]
    model_keys: np.ndarray
    model_counts: np.ndarray
    words: np.ndarray
    dense: list[memoryview]


def _parse(old: State, patch: bytes, cap: int) -> _Parsed:
    if len(patch) > cap:
        raise SizeLimitExceeded(f"patch is {len(patch)} bytes, above the cap of {cap}")
    reader = Reader(patch, "PULSESync patch")
    base_hash, result_hash = _read_preamble(reader)
    entries = _read_entries(reader, old)
    changes = sum(int(e.k.sum()) for e in entries)
    max_key = max(DTYPE_CODES.values()) * NUM_CONTEXTS + NUM_CONTEXTS - 1
    keys, counts = read_histograms(
        reader, max_key=max_key, alphabet=values.ALPHABET, max_count=changes, what="value model"
    )
    words = reader.u32_array(reader.varint(1 << 40, "stream words"))  # a lie shows up as truncation
    dense = [reader.raw(e.dense_len) for e in entries if e.mode == DENSE]
    reader.expect_end()
    return _Parsed(base_hash, result_hash, entries, keys, counts, words, dense)


def _read_preamble(reader: Reader) -> tuple[str, str]:
    if bytes(reader.raw(4)) != MAGIC:
        raise UnknownVersion("not a PULSESync patch (bad magic)")
    version = reader.u8()
    if version != VERSION:
        raise UnknownVersion(f"PULSESync patch version {version} is not supported (this node speaks {VERSION})")
    return bytes(reader.raw(32)).hex(), bytes(reader.raw(32)).hex()


def _read_entries(reader: Reader, old: State) -> list[_Entry]:
    names = sorted(old)
    count = reader.varint(1 << 32, "tensor count")
    if count != len(names):
        raise LayoutMismatch(f"patch has {count} tensors, this state has {len(names)}")
    entries = []
    for name in names:
        dtype = dtype_name(old[name].dtype)
        code = reader.u8()
        numel = reader.varint(1 << 62, "numel")
        if code != DTYPE_CODES[dtype] or numel != old[name].numel():
            got = _DTYPE_BY_CODE.get(code, f"code {code}")
            raise LayoutMismatch(f"{name}: patch has {got} x {numel}, state has {dtype} x {old[name].numel()}")
        entries.append(_read_entry(reader, name, dtype, numel))
    return entries


def _read_entry(reader: Reader, name: str, dtype: str, numel: int) -> _Entry:
    mode = reader.u8()
    if mode == SAME:
        return _Entry(name, dtype, mode)
    if mode == DENSE:
        return _Entry(name, dtype, mode, dense_len=reader.varint(1 << 40, f"{name} dense length"))
    if mode != SPARSE:
        raise MalformedPayload(f"{name}: unknown tensor mode {mode}")
    classes, k, theta = positions.read_table(reader, name, numel)
    if not len(classes):
        raise MalformedPayload(f"{name}: a sparse tensor needs at least one changed class")
    return _Entry(name, dtype, mode, classes=classes, k=k, theta=theta)


def _decode_body(old: State, parsed: _Parsed) -> dict[str, torch.Tensor]:
    entries, keys, counts = parsed.entries, parsed.model_keys, parsed.model_counts
    sparse = [e for e in entries if e.mode == SPARSE]
    # one context order per sparse tensor, alive only during this decode (8 bytes per weight)
    orders = parallel_map(lambda e: _context(bits(old[e.name]), e.dtype), sparse)
    tables = [
        positions.check_table(e.name, e.classes, e.k, e.theta, order.counts)
        for e, (_, order) in zip(sparse, orders, strict=True)
    ]
    dec = AnsDecoder(parsed.words)
    gaps = positions.decode_tables(dec, tables)
    ends = np.cumsum([int(t.k.sum()) for t in tables]).tolist()
    located = [
        _positions(e.dtype, ctx_order, table, gaps[end - int(table.k.sum()) : end])
        for e, ctx_order, table, end in zip(sparse, orders, tables, ends, strict=True)
    ]
    pos_by_tensor = [pos for pos, _ in located]
    model_keys = [key for _, key in located]
    key_all = np.concatenate(model_keys) if sparse else np.zeros(0, dtype=np.int64)
    model_of = np.searchsorted(keys, key_all)
    if len(key_all) and (np.any(model_of >= len(keys)) or np.any(keys[np.minimum(model_of, len(keys) - 1)] != key_all)):
        raise MalformedPayload("a changed weight's exponent has no value model in the patch")
    if not np.array_equal(np.bincount(model_of, minlength=len(keys)), counts.sum(axis=1)):
        raise MalformedPayload("value model counts disagree with the number of changes they cover")
    z = values.decode_values(dec, model_of, counts)
    dec.finish()
    return _assemble(old, entries, pos_by_tensor, z, parsed.dense)


def _context(raw_old: np.ndarray, dtype: str) -> tuple[np.ndarray, ContextOrder]:
    ctx = exponent_context(raw_old, dtype)
    return ctx, ContextOrder(ctx)


def _positions(
    dtype: str, ctx_order: tuple[np.ndarray, ContextOrder], table: positions.ClassTable, gaps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Changed positions of one tensor (class-major) and the value model key of each."""
    ctx, order = ctx_order
    sidx = positions.join_gaps(gaps, order.starts[table.classes], table.n, table.k)
    pos = order.positions(sidx)
    return pos, DTYPE_CODES[dtype] * NUM_CONTEXTS + ctx[pos].astype(np.int64)


def _assemble(
    old: State, entries: list[_Entry], pos_by_tensor: list[np.ndarray], z: np.ndarray, dense: list[memoryview]
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    sparse_i = dense_i = offset = 0
    for e in entries:
        tensor = old[e.name]
        raw = bits(tensor)
        if e.mode == SAME:
            new_raw = raw
        elif e.mode == DENSE:
            new_raw = _inflate(dense[dense_i], raw, e.name)
            dense_i += 1
        else:
            pos = pos_by_tensor[sparse_i]
            sparse_i += 1
            new_raw = raw.copy()
            new_raw[pos] = values.from_symbols(raw[pos], z[offset : offset + len(pos)], e.dtype)
            offset += len(pos)
        out[e.name] = from_bits(new_raw, e.dtype, tuple(tensor.shape))
    return out


def _inflate(section: memoryview, raw_old: np.ndarray, name: str) -> np.ndarray:
    """Decompress a dense section, reading at most one byte more than the tensor's size."""
    size = raw_old.nbytes
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(section)) as stream:
            data = stream.read(size + 1)
    except zstandard.ZstdError as exc:
        raise MalformedPayload(f"{name}: dense section does not decompress: {exc}") from exc
    if len(data) > size:
        raise DecompressionBomb(f"{name}: dense section expands past the tensor's {size} bytes")
    if len(data) < size:
        raise MalformedPayload(f"{name}: dense section has {len(data)} bytes, tensor needs {size}")
    return np.frombuffer(data, dtype=raw_old.dtype).copy()


def bits_per_changed(stats: PatchStats) -> float:
    return 8 * stats.patch_bytes / stats.changed if stats.changed else math.inf
