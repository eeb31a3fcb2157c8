"""PULSESync: a lossless patch from one state dict to another, for sparse BF16 updates.

    patch = encode(old, new)
    new_again = apply(old, patch)      # bit for bit equal to `new`, or an exception

The receiver already holds `old`, so everything is conditioned on it (contexts.py): positions
are gaps between ranks within the old weight's exponent class (positions.py), values are
bit-pattern differences modeled per (dtype, old exponent) (syncpass.py), coded with rANS
(ans.py). Each changed tensor has its own stream, read in the order a single pass over the old
weights meets the changes, so decoding is one compiled walk per tensor, tensors on all cores,
with no per-weight memory; apply hashes each slab of the new state while it is still in cache.
A tensor whose sparse form would cost more than its dense form is sent dense (one zstd frame of
the raw new bytes).

Format v2, little-endian, varints are LEB128 (wire.py):

    "PSYN" u8 version | base state hash (32) | result state hash (32) | varint tensor count
    per tensor, in sorted-name order of the base state:
        u8 dtype code | varint numel | u8 mode (0 same, 1 sparse, 2 dense)
        sparse: class table (positions.write_table) | varint stream words
        dense:  varint compressed length
    value models (ans.write_histograms; key = dtype code * 256 + old exponent)
    the sparse tensors' streams (u16 words each), in tensor order | dense sections | end

Version 1 (one stream, class-major order, SHA-256 state hash v1) is refused as unknown.

invariant: a patch applies only to the state whose hash it names, and `apply` returns only a
state whose hash is the one the patch names.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import zstandard

from protocol import changes, positions, syncpass, tensorbytes
from protocol.ans import Models, read_histograms, require, write_histograms
from protocol.contexts import EXPONENT, NUM_CONTEXTS
from protocol.errors import (
    DecompressionBomb,
    IncompatibleStates,
    InvalidPositions,
    LayoutMismatch,
    MalformedPayload,
    SizeLimitExceeded,
    StateHashMismatch,
    TrailingBytes,
    TruncatedPayload,
    UnknownVersion,
)
from protocol.parallel import parallel_map
from protocol.state import State, StateDict
from protocol.statehash import CHUNK_BYTES, StateDigests, digest_bytes, state_hash, tensor_digests
from protocol.tensorbytes import bits, dtype_name, host_slabs, raw_dtype
from protocol.wire import Reader, Writer

MAGIC = b"PSYN"
VERSION = 2
DTYPE_CODES = {"bfloat16": 1, "float16": 2, "float32": 3}
_DTYPE_BY_CODE = {v: k for k, v in DTYPE_CODES.items()}
_WIDTH = {"bfloat16": 16, "float16": 16, "float32": 32}
SAME, SPARSE, DENSE = 0, 1, 2
_HEADER_SLACK = 1 << 16
_SLAB_BYTES = CHUNK_BYTES  # decode and hash this much of a tensor at a time: both slabs stay in cache


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
    coder_seconds: float = 0.0  # wall time of the host coder (value models and streams), all cores
    _z_all: list[np.ndarray] = field(default_factory=list, repr=False)


@dataclass
class _Changes:
    """One tensor's changes, as the encoder prepares them."""

    cls: np.ndarray  # (k,) uint8 old exponent of each change, natural order
    gap: np.ndarray  # (k,) int32 (int64 for huge tensors) gap from the class's previous change
    zs: np.ndarray  # (k,) value z of each change, in the weights' width
    k: np.ndarray  # (256,) changes per class
    n: np.ndarray  # (256,) class sizes
    codes: np.ndarray  # (256,) gap code byte per class
    gap_bits: float  # what the gaps cost under those codes
    classes: np.ndarray  # the classes with changes, ascending
    hist: np.ndarray  # (len(classes), ALPHABET) value symbols of each of them
    extra: np.ndarray  # (256,) extra value bits per class

    def table(self) -> positions.ClassTable:
        c = self.classes
        return positions.ClassTable(c, self.k[c], self.codes[c])

    def position_bits(self) -> float:
        return sum(positions.log2_binomial(int(self.n[c]), int(self.k[c])) for c in self.classes)

    def sparse_bits_estimate(self) -> float:
        """Gaps at their coded cost, values at their entropy, the table at about 3 bytes a class."""
        values = _entropy_bits(self.hist) + float(self.extra.sum())
        return self.gap_bits + values + 24 * len(self.classes)


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
    return _encode(old, new, old_hash, new_hash, 1, None)


def encode_with_stats(
    old: State, new: State, *, old_hash: str | None = None, new_hash: str | None = None, zstd_level: int = 1
) -> tuple[bytes, PatchStats]:
    stats = PatchStats()
    patch = _encode(old, new, old_hash, new_hash, zstd_level, stats)
    stats.order0_value_bits = _order0_value_bits(stats._z_all)
    stats._z_all.clear()
    return patch, stats


def _encode(
    old: State, new: State, old_hash: str | None, new_hash: str | None, zstd_level: int, stats: PatchStats | None
) -> bytes:
    check_layout(old, new)
    names = sorted(old)
    found = parallel_map(lambda name: _collect(old[name], new[name]), names)
    dense_names = {
        name
        for name, ch in zip(names, found, strict=True)
        if ch is not None and ch.sparse_bits_estimate() >= 8 * old[name].numel() * old[name].element_size()
    }
    sparse = {name: ch for name, ch in zip(names, found, strict=True) if ch is not None and name not in dense_names}
    coding = time.perf_counter()  # the host coder sees only the changes: its time grows with them
    keys, counts, rows = _value_models(old, sparse)
    models = Models.from_counts(counts)
    streams = parallel_map(lambda name: _stream(sparse[name], rows[name], models), list(sparse))
    if stats is not None:
        stats.coder_seconds = time.perf_counter() - coding
    dense = parallel_map(lambda name: _deflate(new[name], zstd_level), sorted(dense_names))
    head = Writer()
    head.raw(MAGIC)
    head.u8(VERSION)
    head.raw(bytes.fromhex(old_hash or state_hash(old)))
    head.raw(bytes.fromhex(new_hash or state_hash(new)))
    head.varint(len(names))
    words = dict(zip(sparse, streams, strict=True))
    sections = dict(zip(sorted(dense_names), dense, strict=True))
    for name, ch in zip(names, found, strict=True):
        head.u8(DTYPE_CODES[dtype_name(old[name].dtype)])
        head.varint(old[name].numel())
        if ch is None:
            head.u8(SAME)
        elif name in sections:
            head.u8(DENSE)
            head.varint(len(sections[name]))
        else:
            head.u8(SPARSE)
            positions.write_table(head, ch.table())
            head.varint(len(words[name]))
    write_histograms(head, keys, counts)
    for name in sparse:
        head.raw(words[name].astype("<u2").tobytes())
    for name in sorted(dense_names):
        head.raw(sections[name])
    patch = head.getvalue()
    if stats is not None:
        _fill_stats(stats, old, found, names, sections, counts, sparse, len(patch))
    return patch


def _collect(old: torch.Tensor, new: torch.Tensor) -> _Changes | None:
    """One pass over the tensor: the compiled walk on the host, torch ops on any other device
    (changes.py), which send the host only the changes."""
    if old.numel() == 0:
        return None
    dtype = dtype_name(old.dtype)
    shift, emask = EXPONENT[dtype]
    if tensorbytes.on_host(old):
        offsets = np.zeros(0, np.int32 if old.numel() < 1 << 31 else np.int64)
        n, last = np.zeros(NUM_CONTEXTS, np.int64), np.full(NUM_CONTEXTS, -1, np.int64)
        hist = np.zeros((NUM_CONTEXTS, syncpass.ALPHABET), np.int64)
        cls, gap, zs = syncpass.collect(bits(old), bits(new), shift, emask, _WIDTH[dtype], offsets, n, last, hist)
    else:
        found = changes.collect(old, new, shift, emask, _WIDTH[dtype])
        cls, gap, zs, n = found.cls, found.gap, found.zs, found.n
        hist = syncpass.value_histogram(cls, zs)
    if not len(cls):
        return None
    k = hist.sum(axis=1)
    codes, costs = positions.choose_codes(cls, gap, n, k)
    classes = np.flatnonzero(k)
    return _Changes(cls, gap, zs, k, n, codes, float(costs.sum()), classes, hist[classes], syncpass.extra_bits(hist))


def _value_models(old: State, sparse: dict[str, _Changes]) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Global models keyed dtype code * 256 + exponent; per tensor, the model row of each class."""
    totals: dict[int, np.ndarray] = {}
    for name, ch in sparse.items():
        base = DTYPE_CODES[dtype_name(old[name].dtype)] * NUM_CONTEXTS
        for c, row in zip(ch.classes.tolist(), ch.hist, strict=True):
            totals[base + c] = totals.get(base + c, 0) + row
    keys = np.array(sorted(totals), dtype=np.int64)
    counts = np.stack([totals[int(key)] for key in keys]) if len(keys) else np.zeros((0, syncpass.ALPHABET), np.int64)
    index = {int(key): i for i, key in enumerate(keys)}
    rows = {}
    for name, ch in sparse.items():
        base = DTYPE_CODES[dtype_name(old[name].dtype)] * NUM_CONTEXTS
        row = np.full(NUM_CONTEXTS, -1, np.int64)
        for c in ch.classes.tolist():
            row[c] = index[base + c]
        rows[name] = row
    return keys, counts, rows


def _stream(ch: _Changes, row: np.ndarray, models: Models) -> np.ndarray:
    b, t = positions.split_code(ch.codes)
    t = np.where(ch.k > 0, t, -1)
    return syncpass.encode_stream(ch.cls, ch.gap, ch.zs, b, t, row, models.freq, models.cum)


def _deflate(tensor: torch.Tensor, level: int) -> bytes:
    """One zstd frame of the tensor's raw little-endian bytes, with its content size."""
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True)
    raw = next(host_slabs(tensor, 0, tensor.numel(), max(tensor.numel(), 1)), np.zeros(0, np.uint8))
    return cctx.compress(raw.view(np.uint8).data)


def _entropy_bits(counts: np.ndarray) -> float:
    """Empirical order-0 entropy in bits in total, summed over the rows of a histogram (or one row)."""
    c = np.atleast_2d(counts).astype(np.float64)
    totals = c.sum(axis=1)
    plogp = c * np.log2(np.where(c > 0, c, 1.0))
    return float((totals * np.log2(np.where(totals > 0, totals, 1.0))).sum() - plogp.sum())


def _fill_stats(
    stats: PatchStats,
    old: State,
    found: list[_Changes | None],
    names: list[str],
    sections: dict[str, bytes],
    counts: np.ndarray,
    sparse: dict[str, _Changes],
    size: int,
) -> None:
    stats.patch_bytes = size
    for name, ch in zip(names, found, strict=True):
        stats.elements += old[name].numel()
        if ch is None:
            continue
        k = int(ch.k.sum())
        stats.changed += k
        stats.order0_position_bits += positions.log2_binomial(old[name].numel(), k)
        stats._z_all.append(ch.zs)
        if name in sections:
            stats.dense_tensors += 1
            stats.position_bound_bits += 8 * len(sections[name])  # dense: its compressed bytes count in full
        else:
            stats.position_bound_bits += ch.position_bits()
    extra = sum(float(ch.extra.sum()) for ch in sparse.values())
    stats.value_bound_bits += _entropy_bits(counts) + extra


def _order0_value_bits(z_parts: list[np.ndarray]) -> float:
    if not z_parts:
        return 0.0
    _, counts = np.unique(np.concatenate(z_parts), return_counts=True)
    return _entropy_bits(counts)


# -- decoding -------------------------------------------------------------------------------


@dataclass
class _Entry:
    """One tensor as the patch header describes it."""

    name: str
    dtype: str
    mode: int
    table: positions.ClassTable | None = None
    words: np.ndarray | None = None  # its stream (sparse)
    dense: memoryview | None = None  # its zstd frame (dense)
    stream_len: int = 0
    dense_len: int = 0


@dataclass
class _Parsed:
    base_hash: str
    result_hash: str
    entries: list[_Entry]
    model_keys: np.ndarray
    model_counts: np.ndarray


def default_max_bytes(state: State) -> int:
    """The largest patch worth accepting for `state`: its dense size, plus header slack."""
    return sum(t.numel() * t.element_size() for t in state.values()) * 11 // 10 + _HEADER_SLACK


def apply(old: State, patch: bytes, *, max_bytes: int | None = None, held_hash: str | None = None) -> StateDict:
    """The state `patch` produces from `old`. `old` is never modified.

    `held_hash`: the hash of `old` if the caller already knows it (a node knows the hash of the
    state it holds), so that only the new state is hashed. Raises a `ProtocolError` subclass for
    any patch that is malformed, does not apply to `old`, or does not produce the state it names;
    nothing is returned in that case.
    """
    return apply_with_digests(old, patch, max_bytes=max_bytes, held_hash=held_hash)[0]


def apply_with_digests(
    old: State, patch: bytes, *, max_bytes: int | None = None, held_hash: str | None = None
) -> tuple[StateDict, StateDigests]:
    """`apply`, also returning the new state's chunk digests (statehash.py), already verified."""
    parsed = _parse(old, patch, default_max_bytes(old) if max_bytes is None else max_bytes)
    plans = _plan(parsed)  # every check that needs no weights, before hashing or decoding anything
    held = held_hash or state_hash(old)
    if held != parsed.base_hash:
        raise StateHashMismatch(f"patch applies to state {parsed.base_hash[:16]}, this state is {held[:16]}")
    new, digests = _decode_body(old, parsed, plans, hashing=True)
    assert digests is not None
    got = digests.root()
    if got != parsed.result_hash:
        raise StateHashMismatch(f"patch should produce state {parsed.result_hash[:16]} but produced {got[:16]}")
    return new, digests


def apply_unverified(old: State, patch: bytes, *, max_bytes: int | None = None) -> StateDict:
    """`apply` without either state hash check: for measuring the codec alone, never for peer bytes."""
    cap = default_max_bytes(old) if max_bytes is None else max_bytes
    parsed = _parse(old, patch, cap)
    return _decode_body(old, parsed, _plan(parsed), hashing=False)[0]


def _parse(old: State, patch: bytes, cap: int) -> _Parsed:
    if len(patch) > cap:
        raise SizeLimitExceeded(f"patch is {len(patch)} bytes, above the cap of {cap}")
    reader = Reader(patch, "PULSESync patch")
    base_hash, result_hash = _read_preamble(reader)
    entries = _read_entries(reader, old)
    changes = sum(e.table.total for e in entries if e.table is not None)
    max_key = max(DTYPE_CODES.values()) * NUM_CONTEXTS + NUM_CONTEXTS - 1
    keys, counts = read_histograms(
        reader, max_key=max_key, alphabet=syncpass.ALPHABET, max_count=changes, what="value model"
    )
    for e in entries:
        if e.mode == SPARSE:  # a copy: aligned for the compiled walker
            e.words = reader.u16_array(e.stream_len)
    for e in entries:
        if e.mode == DENSE:
            e.dense = reader.raw(e.dense_len)
    reader.expect_end()
    return _Parsed(base_hash, result_hash, entries, keys, counts)


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
    table = positions.read_table(reader, name, numel)
    if not len(table.classes):
        raise MalformedPayload(f"{name}: a sparse tensor needs at least one changed class")
    if dtype == "float16" and table.classes[-1] > EXPONENT[dtype][1]:
        raise MalformedPayload(f"{name}: context {table.classes[-1]} is not a float16 exponent")
    # the length only bounds a view of bytes already in hand: a lie shows up as truncation
    return _Entry(name, dtype, mode, table=table, stream_len=reader.varint(1 << 40, f"{name} stream words"))


@dataclass
class _Walk:
    """A sparse tensor's per-class decoding state (arrays indexed by context)."""

    left: np.ndarray
    code_b: np.ndarray
    code_t: np.ndarray
    row: np.ndarray


def _plan(parsed: _Parsed) -> dict[str, _Walk]:
    """Per sparse tensor: its classes' model rows and codes, after the checks that need no weights:
    every changed class has a value model, the models count exactly the changes they cover, and
    each stream is long enough for what its table claims."""
    index = {int(key): i for i, key in enumerate(parsed.model_keys)}
    covered = np.zeros(len(parsed.model_keys), np.int64)
    plans = {}
    for e in parsed.entries:
        if e.mode != SPARSE:
            continue
        assert e.table is not None and e.words is not None
        base = DTYPE_CODES[e.dtype] * NUM_CONTEXTS
        zeros = lambda: np.zeros(NUM_CONTEXTS, np.int64)  # noqa: E731
        walk = _Walk(left=zeros(), code_b=zeros(), code_t=zeros(), row=np.full(NUM_CONTEXTS, -1, np.int64))
        b, t = positions.split_code(e.table.code)
        for c, k, bc, tc in zip(e.table.classes.tolist(), e.table.k.tolist(), b.tolist(), t.tolist(), strict=True):
            if base + c not in index:
                raise MalformedPayload(f"{e.name}: exponent {c} has changes but no value model")
            walk.left[c], walk.code_b[c], walk.code_t[c], walk.row[c] = k, bc, tc, index[base + c]
            covered[index[base + c]] += k
        _require(e)
        plans[e.name] = walk
    if not np.array_equal(covered, parsed.model_counts.sum(axis=1)):
        raise MalformedPayload("value model counts disagree with the number of changes they cover")
    return plans


def _require(e: _Entry) -> None:
    """Refuse a table that claims more than its stream can carry: each change is at least one
    value symbol, each coded gap one geometric symbol plus its remainder bits."""
    assert e.table is not None and e.words is not None
    symbols, raw = positions.group_cost(e.table.k, e.table.code)
    require(e.words, e.table.total + symbols, raw, f"{e.name}: stream")


def _decode_body(
    old: State, parsed: _Parsed, plans: dict[str, _Walk], *, hashing: bool
) -> tuple[StateDict, StateDigests | None]:
    models = Models.from_counts(parsed.model_counts) if len(parsed.model_keys) else None

    def one(e: _Entry) -> tuple[torch.Tensor, list[bytes]]:
        tensor = old[e.name]
        if e.mode == SPARSE:
            return _walk_tensor(e, tensor, plans[e.name], models, hashing)
        if e.mode == DENSE:
            return _inflate(e, tensor, hashing)
        return _copy(tensor, hashing)

    results = parallel_map(one, parsed.entries)
    new = {e.name: t for e, (t, _) in zip(parsed.entries, results, strict=True)}
    if not hashing:
        return new, None
    digests = tuple(tensor_digests(e.name, old[e.name], d) for e, (_, d) in zip(parsed.entries, results, strict=True))
    return new, StateDigests(digests)


def _slabs(tensor: torch.Tensor) -> int:
    return max(1, _SLAB_BYTES // tensor.element_size())


def _sink(new: torch.Tensor) -> tuple[np.ndarray | None, torch.Tensor]:
    """A writable host view of `new` when it lives on the CPU (None otherwise), and its flat view."""
    flat = new.view(-1)
    return (bits(new) if tensorbytes.on_host(new) else None), flat


def _store(view: np.ndarray | None, flat: torch.Tensor, lo: int, out: np.ndarray, old: np.ndarray) -> None:
    """Put a decoded host slab into the new tensor: a no-op when it was decoded in place; on
    another device, where `flat` starts as a copy of the old tensor, only the changed entries
    cross (a gather on the host, a scatter on the device)."""
    if view is None:
        where = np.flatnonzero(out != old)
        if len(where):
            values = out[where].view(out.dtype.str.replace("u", "i"))
            index = torch.from_numpy(where + lo).to(flat.device)
            flat[index] = torch.from_numpy(values).view(flat.dtype).to(flat.device)


def _walk_tensor(
    e: _Entry, tensor: torch.Tensor, plan: _Walk, models: Models | None, hashing: bool
) -> tuple[torch.Tensor, list[bytes]]:
    assert e.words is not None and e.table is not None and models is not None
    shift, emask = EXPONENT[e.dtype]
    on_host = tensorbytes.on_host(tensor)
    new = (torch.empty_like if on_host else torch.clone)(tensor, memory_format=torch.contiguous_format)
    view, flat = _sink(new)
    left = plan.left.copy()
    state = np.array([0, 0], np.int64)
    state[0], state[1] = _stream_start(e)
    nxt, rem = np.zeros(NUM_CONTEXTS, np.int64), np.zeros(NUM_CONTEXTS, np.int64)
    _check(syncpass.start_walk(e.words, left, plan.code_b, plan.code_t, state, nxt, rem), e.name)
    digests: list[bytes] = []
    slab = _slabs(tensor)
    for lo, a in zip(range(0, tensor.numel(), slab), host_slabs(tensor, 0, tensor.numel(), slab), strict=True):
        out = view[lo : lo + len(a)] if view is not None else np.empty_like(a)
        status = syncpass.walk(
            a, out, shift, emask, _WIDTH[e.dtype], e.words, state, nxt, rem, left,
            plan.code_b, plan.code_t, plan.row, models.packed,
        )  # fmt: skip
        _check(status, e.name)
        _store(view, flat, lo, out, a)
        if hashing:
            digests += digest_bytes(out)
    _finish(e, left, syncpass.class_sizes(nxt, rem), state)
    return new, digests


def _stream_start(e: _Entry) -> tuple[int, int]:
    assert e.words is not None
    if len(e.words) < 2:
        raise TruncatedPayload(f"{e.name}: stream is shorter than its two-word state")
    x = (int(e.words[0]) << 16) | int(e.words[1])
    if x < 1 << 16:
        raise MalformedPayload(f"{e.name}: stream starts with an impossible state")
    return x, 2


def _check(status: int, name: str) -> None:
    if status != 0:
        raise TruncatedPayload(f"{name}: stream ends before its last symbol")


def _finish(e: _Entry, left: np.ndarray, cnt: np.ndarray, state: np.ndarray) -> None:
    """After the walk: every change found, fully-changed classes exactly full, the stream spent."""
    assert e.table is not None and e.words is not None
    if np.any(left):
        raise InvalidPositions(f"{e.name}: a change's rank is past the end of its exponent class")
    full = e.table.code == positions.FULL
    if np.any((e.table.k == cnt[e.table.classes]) != full):
        raise MalformedPayload(f"{e.name}: the fully-changed flag disagrees with the exponent class sizes")
    if state[1] != len(e.words):
        raise TrailingBytes(f"{e.name}: {len(e.words) - state[1]} stream words after the last symbol")
    if state[0] != 1 << 16:
        raise MalformedPayload(f"{e.name}: stream does not end in the encoder's initial state")


def _inflate(e: _Entry, tensor: torch.Tensor, hashing: bool) -> tuple[torch.Tensor, list[bytes]]:
    """A dense section: exactly one zstd frame that declares exactly the tensor's size, nothing after it."""
    assert e.dense is not None
    size = tensor.numel() * tensor.element_size()
    try:
        declared = zstandard.frame_content_size(e.dense)
    except zstandard.ZstdError as exc:
        raise MalformedPayload(f"{e.name}: dense section is not a zstd frame: {exc}") from exc
    if declared > size:
        raise DecompressionBomb(f"{e.name}: dense section declares {declared} bytes, the tensor has {size}")
    if declared != size:  # smaller, or unknown (-1): zstd would size its output from the data
        raise MalformedPayload(f"{e.name}: dense section declares {declared} bytes, the tensor needs {size}")
    try:
        data = zstandard.ZstdDecompressor().decompress(e.dense, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise MalformedPayload(f"{e.name}: dense section is not exactly one whole zstd frame: {exc}") from exc
    if len(data) != size:
        raise MalformedPayload(f"{e.name}: dense section has {len(data)} bytes, tensor needs {size}")
    new = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    view, flat = _sink(new)
    raw = np.frombuffer(data, dtype=raw_dtype(e.dtype).newbyteorder("<")).astype(raw_dtype(e.dtype), copy=False)
    if view is not None:
        view[:] = raw
    else:
        signed = raw.view(raw.dtype.str.replace("u", "i"))
        flat.copy_(torch.from_numpy(signed).view(flat.dtype))
    return new, digest_bytes(raw) if hashing else []


def _copy(tensor: torch.Tensor, hashing: bool) -> tuple[torch.Tensor, list[bytes]]:
    new = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    view, flat = _sink(new)
    if view is not None:
        view[:] = bits(tensor)  # numpy's copy: no thread pool to wake (this runs on the codec's own threads)
    else:
        flat.copy_(tensor.reshape(-1))
    if not hashing:
        return new, []
    slab = _slabs(tensor)
    return new, [d for raw in host_slabs(new, 0, new.numel(), slab) for d in digest_bytes(raw)]


def bits_per_changed(stats: PatchStats) -> float:
    return 8 * stats.patch_bytes / stats.changed if stats.changed else math.inf
