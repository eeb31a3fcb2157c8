"""PULSESync: exact round trips for every bit pattern, and rejection of every hostile patch."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import positions, pulsesync, syncpass
from protocol.ans import Models
from protocol.errors import (
    DecompressionBomb,
    IncompatibleStates,
    InvalidPositions,
    LayoutMismatch,
    MalformedPayload,
    ProtocolError,
    SizeLimitExceeded,
    StateHashMismatch,
    TrailingBytes,
    TruncatedPayload,
    UnknownVersion,
    UnsupportedDtype,
)
from protocol.statehash import state_hash
from protocol.tensorbytes import bits, from_bits
from protocol.wire import Writer

DTYPES = ["bfloat16", "float16", "float32"]


def random_bits(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Any bit pattern at all: NaN payloads, infinities, -0.0, subnormals included."""
    width = np.uint32 if dtype == "float32" else np.uint16
    raw = rng.integers(0, np.iinfo(width).max, size=int(np.prod(shape)), dtype=width, endpoint=True)
    return from_bits(raw, dtype, shape)


def perturb(rng: np.random.Generator, t: torch.Tensor, density: float, big: bool) -> torch.Tensor:
    raw = bits(t).copy()
    hit = rng.random(raw.size) < density
    if big:  # arbitrary new patterns
        raw[hit] = rng.integers(0, np.iinfo(raw.dtype).max, size=int(hit.sum()), dtype=raw.dtype, endpoint=True)
    else:  # a few ulps, as optimizer updates are
        raw[hit] = raw[hit] + rng.integers(-3, 4, size=int(hit.sum())).astype(raw.dtype)
    name = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[t.dtype]
    return from_bits(raw, name, tuple(t.shape))


def same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(bits(a[k]), bits(b[k])) for k in a)


def snapshot(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: bits(v).copy() for k, v in state.items()}


def assert_untouched(state: dict[str, torch.Tensor], snap: dict[str, np.ndarray]) -> None:
    assert all(np.array_equal(bits(state[k]), snap[k]) for k in snap)


def weight_pair(seed: int = 0, n: int = 20_000, lr: float = 3e-6) -> tuple[dict, dict]:
    """BF16 weights before and after one small update, like an optimizer step."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=gen) * 0.02
    g = torch.randn(n, generator=gen)
    old = {"w": w.bfloat16().reshape(100, -1), "ln": torch.ones(64, dtype=torch.bfloat16)}
    new = {"w": (w - lr * g).bfloat16().reshape(100, -1), "ln": old["ln"].clone()}
    return old, new


# -- round trips -----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(1, 40), min_size=0, max_size=3).map(tuple),
    density=st.sampled_from([0.0, 0.001, 0.02, 0.3, 1.0]),
    big=st.booleans(),
)
def test_round_trip_is_bit_exact_for_any_patterns(seed, dtype, shape, density, big) -> None:
    rng = np.random.default_rng(seed)
    old = {"a": random_bits(rng, dtype, shape), "b": random_bits(rng, "bfloat16", (7, 3))}
    new = {"a": perturb(rng, old["a"], density, big), "b": perturb(rng, old["b"], density, big)}
    snap = snapshot(old)
    result = pulsesync.apply(old, pulsesync.encode(old, new))
    assert same_bits(result, new)
    assert state_hash(result) == state_hash(new)
    assert_untouched(old, snap)


def test_special_values_survive() -> None:
    specials = [0x7FC0, 0x7FC1, 0xFFFF, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001, 0x807F, 0x3F80]
    old = {"s": from_bits(np.array(specials, dtype=np.uint16), "bfloat16", (10,))}
    new = {"s": from_bits(np.array(specials[::-1], dtype=np.uint16), "bfloat16", (10,))}
    assert same_bits(pulsesync.apply(old, pulsesync.encode(old, new)), new)


def test_sparse_update_is_small_and_conditioned() -> None:
    old, new = weight_pair()
    patch, stats = pulsesync.encode_with_stats(old, new)
    assert 0 < stats.changed < 0.2 * stats.elements
    assert stats.dense_tensors == 0
    bound = stats.position_bound_bits + stats.value_bound_bits
    assert 8 * len(patch) <= 1.25 * bound + 8 * 300  # small state: allow the fixed header
    assert bound < stats.order0_position_bits + stats.order0_value_bits
    assert same_bits(pulsesync.apply(old, patch), new)


def test_unchanged_state_gives_tiny_patch() -> None:
    old, _ = weight_pair()
    patch = pulsesync.encode(old, old)
    assert len(patch) < 120
    assert same_bits(pulsesync.apply(old, patch), old)


def test_fully_rewritten_tensor_goes_dense() -> None:
    rng = np.random.default_rng(1)
    old = {"x": random_bits(rng, "bfloat16", (4096,))}
    new = {"x": random_bits(rng, "bfloat16", (4096,))}
    patch, stats = pulsesync.encode_with_stats(old, new)
    assert stats.dense_tensors == 1
    assert len(patch) <= 2 * 4096 + 200
    assert same_bits(pulsesync.apply(old, patch), new)


# -- local misuse ------------------------------------------------------------------------------


def test_mismatched_states_are_refused() -> None:
    a = {"x": torch.zeros(4, dtype=torch.bfloat16)}
    with pytest.raises(IncompatibleStates, match="names"):
        pulsesync.encode(a, {"y": torch.zeros(4, dtype=torch.bfloat16)})
    with pytest.raises(IncompatibleStates, match="x"):
        pulsesync.encode(a, {"x": torch.zeros(5, dtype=torch.bfloat16)})
    with pytest.raises(IncompatibleStates):
        pulsesync.encode(a, {"x": torch.zeros(4, dtype=torch.float16)})
    with pytest.raises(UnsupportedDtype, match="int64"):
        pulsesync.encode({"x": torch.zeros(4, dtype=torch.int64)}, {"x": torch.ones(4, dtype=torch.int64)})


# -- hostile patches ---------------------------------------------------------------------------


@pytest.fixture
def pair_and_patch() -> tuple[dict, dict, bytes]:
    old, new = weight_pair()
    return old, new, pulsesync.encode(old, new)


def rejects(old: dict, patch: bytes, exc: type[Exception], **kw) -> None:
    snap = snapshot(old)
    with pytest.raises(exc):
        pulsesync.apply(old, patch, **kw)
    assert_untouched(old, snap)


def test_truncated_patch(pair_and_patch) -> None:
    old, _, patch = pair_and_patch
    rejects(old, patch[:-1], TruncatedPayload)
    rejects(old, patch[:40], TruncatedPayload)
    for cut in range(0, len(patch), max(1, len(patch) // 50)):
        rejects(old, patch[:cut], ProtocolError)


def test_trailing_bytes(pair_and_patch) -> None:
    old, _, patch = pair_and_patch
    rejects(old, patch + b"\x00", TrailingBytes)


def test_patch_over_the_callers_cap(pair_and_patch) -> None:
    old, _, patch = pair_and_patch
    rejects(old, patch, SizeLimitExceeded, max_bytes=len(patch) - 1)


def test_unknown_version_and_magic(pair_and_patch) -> None:
    old, _, patch = pair_and_patch
    rejects(old, patch[:4] + bytes([99]) + patch[5:], UnknownVersion)
    rejects(old, b"NOPE" + patch[4:], UnknownVersion)


def test_patch_for_another_state(pair_and_patch) -> None:
    old, _, patch = pair_and_patch
    other = {k: v.clone() for k, v in old.items()}
    other["ln"][0] = 2.0
    rejects(other, patch, StateHashMismatch)


def test_result_that_does_not_match_its_hash(pair_and_patch) -> None:
    old, _, patch = pair_and_patch
    lying = patch[:37] + bytes(32) + patch[69:]  # result hash replaced
    rejects(old, lying, StateHashMismatch)


def test_random_corruption_never_escapes_the_error_tree(pair_and_patch) -> None:
    old, new, patch = pair_and_patch
    rng = np.random.default_rng(0)
    for _ in range(200):
        mutated = bytearray(patch)
        i = int(rng.integers(0, len(patch)))
        mutated[i] ^= 1 << int(rng.integers(0, 8))
        try:
            result = pulsesync.apply(old, bytes(mutated))
        except ProtocolError:
            continue
        assert same_bits(result, new)  # only a flip that changes nothing may pass


@settings(max_examples=100, deadline=None)
@given(junk=st.binary(max_size=300))
def test_garbage_is_rejected(junk: bytes) -> None:
    old, _ = weight_pair(n=1000)
    for candidate in (junk, pulsesync.MAGIC + bytes([pulsesync.VERSION]) + junk):
        with pytest.raises(ProtocolError):
            pulsesync.apply(old, candidate)


# Hand-built patches: a lying header behind valid hashes, for each field a peer controls.
# Layout (v2): preamble | count | entries (a sparse entry ends with its stream length) | value
# models | streams (u16 words) | dense sections.


def forge(
    old: dict, entry: bytes, stream: np.ndarray | None = None, models: bytes = b"\x00", tail: bytes = b""
) -> bytes:
    w = Writer()
    w.raw(pulsesync.MAGIC)
    w.u8(pulsesync.VERSION)
    w.raw(bytes.fromhex(state_hash(old)))
    w.raw(bytes(32))
    w.varint(1)
    w.raw(entry)
    w.raw(models)
    if stream is not None:
        w.raw(stream.astype("<u2").tobytes())
    w.raw(tail)
    return w.getvalue()


def entry(numel: int, mode: int, body: bytes, code: int = 1) -> bytes:
    w = Writer()
    w.u8(code)
    w.varint(numel)
    w.u8(mode)
    w.raw(body)
    return w.getvalue()


def varints(*xs: int) -> bytes:
    w = Writer()
    for x in xs:
        w.varint(x)
    return w.getvalue()


ONE = {"x": torch.full((64,), 0.5, dtype=torch.bfloat16)}  # all 64 weights in one exponent class
CTX = int(bits(ONE["x"])[0] >> 7)
GAP_CODE = positions.code_of(0, 5)  # b = 0, the fifth geometric model: any gap can be coded


def sparse_body(k: int, code: int, words: int) -> bytes:
    """One class (CTX) with k changes under gap code `code`, then the stream length."""
    return varints(1, CTX, k) + bytes([code]) + varints(words)


def walker_stream(ranks: list[int], code: int = GAP_CODE, z: int = 0) -> np.ndarray:
    """A real stream for changes at `ranks` of class CTX, each value z (0: one ulp down)."""
    cls = np.full(len(ranks), CTX, dtype=np.uint8)
    gap = np.diff(np.array(ranks), prepend=-1) - 1  # from the previous change of the class
    b, t = (np.zeros(256, np.int64) for _ in range(2))
    t[:] = -1
    if code != positions.FULL:
        (b[CTX],), (t[CTX],) = positions.split_code(np.array([code]))
    row = np.zeros(256, dtype=np.int64)
    models = Models.from_counts(np.bincount([syncpass.value_symbol(z)] * len(ranks), minlength=syncpass.ALPHABET))
    zs = np.full(len(ranks), z, dtype=np.uint16)
    return syncpass.encode_stream(cls, gap.astype(np.int32), zs, b, t, row, models.freq, models.cum)


def one_model(count: int, key: int = 256 + CTX) -> bytes:
    return varints(1, key, 1, 0, count)  # one model; one symbol (z = 0) seen `count` times


def test_the_crafted_patch_itself_works() -> None:
    words = walker_stream([0, 3])
    new = pulsesync.apply_unverified(
        ONE, forge(ONE, entry(64, pulsesync.SPARSE, sparse_body(2, GAP_CODE, len(words))), words, one_model(2))
    )
    changed = np.flatnonzero(bits(new["x"]) != bits(ONE["x"]))
    assert changed.tolist() == [0, 3]


def test_zstd_bomb_in_dense_section() -> None:
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(64 * 2 * 1000))
    rejects(ONE, forge(ONE, entry(64, pulsesync.DENSE, varints(len(bomb))), tail=bomb), DecompressionBomb)


def test_dense_section_too_short() -> None:
    short = zstandard.ZstdCompressor().compress(bytes(10))
    rejects(ONE, forge(ONE, entry(64, pulsesync.DENSE, varints(len(short))), tail=short), MalformedPayload)


def test_dense_section_without_a_declared_size() -> None:
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(128))
    rejects(ONE, forge(ONE, entry(64, pulsesync.DENSE, varints(len(frame))), tail=frame), MalformedPayload)


def test_dense_section_with_data_after_its_frame() -> None:
    frame = zstandard.ZstdCompressor().compress(bytes(128))
    for extra in (b"\x00", b"junk", frame):  # bytes after the frame, or a second whole frame
        section = frame + extra
        rejects(ONE, forge(ONE, entry(64, pulsesync.DENSE, varints(len(section))), tail=section), MalformedPayload)
    ok = forge(ONE, entry(64, pulsesync.DENSE, varints(len(frame))), tail=frame)
    assert same_bits(pulsesync.apply_unverified(ONE, ok), {"x": torch.zeros(64, dtype=torch.bfloat16)})


def test_dense_length_that_lies() -> None:
    rejects(ONE, forge(ONE, entry(64, pulsesync.DENSE, varints(10_000))), TruncatedPayload)


def test_stream_length_that_lies() -> None:
    words = walker_stream([0, 3])
    body = sparse_body(2, GAP_CODE, len(words) + 50)
    rejects(ONE, forge(ONE, entry(64, pulsesync.SPARSE, body), words, one_model(2)), TruncatedPayload)


def test_layout_that_lies() -> None:
    rejects(ONE, forge(ONE, entry(65, pulsesync.SAME, b"")), LayoutMismatch)
    rejects(ONE, forge(ONE, entry(64, pulsesync.SAME, b"", code=3)), LayoutMismatch)


def test_unknown_tensor_mode() -> None:
    rejects(ONE, forge(ONE, entry(64, 7, b"")), MalformedPayload)


def test_unknown_gap_code() -> None:
    words = walker_stream([0, 3])
    body = sparse_body(2, positions.MAX_CODE + 1, len(words))
    rejects(ONE, forge(ONE, entry(64, pulsesync.SPARSE, body), words, one_model(2)), MalformedPayload)


def test_more_changes_than_positions_in_class() -> None:
    body = varints(1, CTX, 65) + bytes([0]) + varints(0)
    rejects(ONE, forge(ONE, entry(64, pulsesync.SPARSE, body)), SizeLimitExceeded)  # k above numel
    words = walker_stream(list(range(64)))  # all 64 changed, yet coded with gaps, not as FULL
    rejects(
        ONE,
        forge(ONE, entry(64, pulsesync.SPARSE, sparse_body(64, GAP_CODE, len(words))), words, one_model(64)),
        MalformedPayload,
    )


def test_fully_changed_flag_on_a_class_that_is_not_full() -> None:
    words = walker_stream(list(range(10)), code=positions.FULL)
    body = sparse_body(10, positions.FULL, len(words))
    rejects(ONE, forge(ONE, entry(64, pulsesync.SPARSE, body), words, one_model(10)), MalformedPayload)
    words = walker_stream(list(range(64)), code=positions.FULL)  # the honest form of a full class
    ok = forge(ONE, entry(64, pulsesync.SPARSE, sparse_body(64, positions.FULL, len(words))), words, one_model(64))
    assert (bits(pulsesync.apply_unverified(ONE, ok)["x"]) == bits(ONE["x"]) - 1).all()


def test_context_out_of_range() -> None:
    body = varints(2, 255, 1) + bytes([9]) + varints(0, 1) + bytes([9])
    rejects(ONE, forge(ONE, entry(64, pulsesync.SPARSE, body)), MalformedPayload)


def test_out_of_range_positions() -> None:
    # two changes in a 64-position class, the second 500 positions past the first
    words = walker_stream([0, 501])
    rejects(
        ONE,
        forge(ONE, entry(64, pulsesync.SPARSE, sparse_body(2, GAP_CODE, len(words))), words, one_model(2)),
        InvalidPositions,
    )


def test_value_models_that_disagree_with_the_changes() -> None:
    words = walker_stream([0, 3])
    body = sparse_body(2, GAP_CODE, len(words))
    rejects(ONE, forge(ONE, entry(64, pulsesync.SPARSE, body), words, one_model(5)), MalformedPayload)  # 5, not 2
    rejects(
        ONE, forge(ONE, entry(64, pulsesync.SPARSE, body), words, one_model(2, key=256 + CTX + 1)), MalformedPayload
    )


def test_stream_with_leftover_data() -> None:
    words = walker_stream([0, 3])
    padded = np.concatenate([words, np.array([7, 7], dtype=np.uint16)])
    body = sparse_body(2, GAP_CODE, len(padded))
    rejects(ONE, forge(ONE, entry(64, pulsesync.SPARSE, body), padded, one_model(2)), TrailingBytes)
    rejects(ONE, forge(ONE, entry(64, pulsesync.SAME, b""), words), TrailingBytes)  # a stream nobody reads


def test_stream_that_ends_early_is_truncated_not_zeros() -> None:
    """Reading past the last word is an error: the decoder never invents zeros to keep going."""
    words = walker_stream(list(range(0, 60, 2)))
    short = words[: len(words) // 2]
    body = sparse_body(30, GAP_CODE, len(short))
    rejects(ONE, forge(ONE, entry(64, pulsesync.SPARSE, body), short, one_model(30)), TruncatedPayload)


def test_tiny_patch_claiming_every_weight_is_refused_before_any_work() -> None:
    """A few hundred bytes that declare every weight of a large state changed (every class
    full, no gap to code) are refused from the header: the stream cannot carry that many symbols."""
    big = {"w": torch.full((1 << 22,), 0.5, dtype=torch.bfloat16)}
    words = walker_stream([0, 1, 2], code=positions.FULL)
    body = varints(1, CTX, 1 << 22) + bytes([positions.FULL]) + varints(len(words))
    patch = forge(big, entry(1 << 22, pulsesync.SPARSE, body), words, one_model(1 << 22))
    assert len(patch) < 200
    start = time.perf_counter()
    with pytest.raises(SizeLimitExceeded, match="stream holds"):
        pulsesync.apply(big, patch)
    assert time.perf_counter() - start < 5.0  # from the header alone; no hash of the state either


def test_old_format_is_refused_by_version() -> None:
    old, new = weight_pair()
    patch = pulsesync.encode(old, new)
    v1 = patch[:4] + bytes([1]) + patch[5:]
    with pytest.raises(UnknownVersion, match="version 1 is not supported"):
        pulsesync.apply(old, v1)


def test_device_paths_stream_through_host_slabs(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a tensor on a GPU goes through (host slabs in, host slabs out), forced on the CPU:
    the same patch bytes, the same result, walks resumed across slabs."""
    old, new = weight_pair(n=60_000)
    old["z"], new["z"] = torch.zeros(300, dtype=torch.bfloat16), torch.full((300,), 1e-3, dtype=torch.bfloat16)
    patch = pulsesync.encode(old, new)
    monkeypatch.setattr(pulsesync.tensorbytes, "on_host", lambda t: False)
    monkeypatch.setattr(pulsesync.changes, "SLAB", 7_000)  # the encoder's device pass in 9 pieces
    assert pulsesync.encode(old, new) == patch
    assert same_bits(pulsesync.apply(old, patch), new)
    monkeypatch.setattr(pulsesync, "_SLAB_BYTES", 2 * 5_000)  # and the decoder's in 6
    assert same_bits(pulsesync.apply_unverified(old, patch), new)


def test_a_held_hash_spares_hashing_the_old_state(monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = weight_pair()
    patch = pulsesync.encode(old, new)
    held = state_hash(old)
    calls = []
    monkeypatch.setattr(pulsesync, "state_hash", lambda s: calls.append(1) or held)
    assert same_bits(pulsesync.apply(old, patch, held_hash=held), new)
    assert calls == []  # only the new state was hashed, slab by slab while it was decoded
    with pytest.raises(StateHashMismatch):  # a held hash that is not the patch's base
        pulsesync.apply(old, patch, held_hash="00" * 32)
