"""PULSELoCo: gating, the exact error-feedback invariant, value formats, crafted hostile payloads.

What every codec must do (round trips, truncation, trailing bytes, caps, corruption, the caller's
tensors untouched) is in test_codec_contract.py.
"""

from __future__ import annotations

import struct
import time
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import floatcode, positions, pulseloco
from protocol.ans import AnsEncoder
from protocol.codec import layout_digest, write_words
from protocol.errors import (
    IncompatibleStates,
    InvalidPositions,
    LayoutMismatch,
    MalformedPayload,
    NonFiniteUpdate,
    NonFiniteValues,
    SizeLimitExceeded,
    TruncatedPayload,
    UnknownVersion,
)
from protocol.positions import ClassTable, write_table
from protocol.pulseloco import PulseLoCoCodec, gate
from protocol.state import StateDict
from protocol.wire import Writer


def make_case(seed: int, scale: float) -> tuple[StateDict, StateDict, StateDict]:
    """(weights BF16, delta, error) for a small model-shaped layout."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"a.weight": (64, 48), "b.bias": (48,), "c.weight": (3, 5, 7)}
    weights = {n: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for n, s in shapes.items()}
    weights["b.bias"][:5] = 0  # zeros: every nonzero update is visible there
    delta = {n: torch.randn(s, generator=g) * scale for n, s in shapes.items()}
    error = {n: torch.randn(s, generator=g) * scale / 4 for n, s in shapes.items()}
    return weights, delta, error


def clone(state: StateDict) -> StateDict:
    return {n: t.clone() for n, t in state.items()}


def same(a: StateDict, b: StateDict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


def bf16_round(x: np.float32) -> int:
    """Round-to-nearest-even of an FP32 to BF16 bits, by hand (an independent brute force)."""
    u = struct.unpack("<I", struct.pack("<f", float(x)))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def brute_gate(w_bits: np.ndarray, s: np.ndarray) -> np.ndarray:
    out = np.zeros(len(s), dtype=bool)
    for i, (wb, si) in enumerate(zip(w_bits.tolist(), s.tolist(), strict=True)):
        w = struct.unpack("<f", struct.pack("<I", wb << 16))[0]
        new = bf16_round(np.float32(w) - np.float32(si))
        out[i] = struct.unpack("<f", struct.pack("<I", new << 16))[0] != w  # value compare: -0 == 0
    return out


@settings(max_examples=40, deadline=None)
@given(
    w_bits=st.lists(st.integers(0, 0xFFFF).filter(lambda b: (b >> 7) & 0xFF != 0xFF), min_size=1, max_size=64),
    log_scale=st.floats(-12, 2),
    seed=st.integers(0, 2**31 - 1),
)
def test_gate_agrees_with_brute_force(w_bits: list[int], log_scale: float, seed: int) -> None:
    bits16 = np.array(w_bits, dtype=np.uint16)
    w = torch.from_numpy(bits16.view(np.int16).copy()).view(torch.bfloat16)
    rng = np.random.default_rng(seed)
    s = (rng.standard_normal(len(bits16)) * 10.0**log_scale * np.abs(w.float().numpy() + 1e-30)).astype(np.float32)
    assert np.array_equal(gate(w, torch.from_numpy(s)).numpy(), brute_gate(bits16, s))


def test_gate_chunk_by_chunk_is_the_whole_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(1000, generator=g) * 0.02).to(torch.bfloat16)
    s = torch.randn(1000, generator=g) * 2e-4
    monkeypatch.setattr(pulseloco, "GATE_CHUNK", 7)  # chunks that do not divide the tensor
    assert np.array_equal(gate(w, s).numpy(), brute_gate(w.view(torch.int16).numpy().view(np.uint16), s.numpy()))


def test_values_are_split_per_tensor_and_never_held_whole_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each tensor's sent values are split into symbol and mantissa as the tensor is done, so the FP32
    values of the whole payload never exist beside their split (4 bytes a sent value at the peak)."""
    g = torch.Generator().manual_seed(5)
    weights = {f"t{i}": (torch.randn(64, 100, generator=g) * 0.02).to(torch.bfloat16) for i in range(4)}
    delta = {n: torch.randn(64, 100, generator=g) * 1e-3 for n in weights}
    expected = PulseLoCoCodec().compress(delta, None, weights)
    sizes: list[int] = []
    split = floatcode.split
    monkeypatch.setattr(floatcode, "split", lambda v, *a: sizes.append(len(v)) or split(v, *a))
    payload, _, stats = PulseLoCoCodec().compress(delta, None, weights)
    assert payload == expected[0] and len(sizes) == len(weights) and sum(sizes) == stats.sent
    assert max(sizes) <= 64 * 100


@pytest.mark.parametrize("value_format", ["bf16", "fp32"])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-7, -1))
def test_error_feedback_invariant_is_exact(value_format: str, seed: int, log_scale: float) -> None:
    weights, delta, error = make_case(seed, 10.0**log_scale)
    codec = PulseLoCoCodec(value_format)
    payload, new_error, stats = codec.compress(delta, error, weights)
    sent = codec.decompress(payload, weights)
    for n in weights:
        s = error[n] + delta[n]
        assert torch.equal(sent[n].double() + new_error[n].double(), s.double())  # exact in real arithmetic
        mask = gate(weights[n], s).reshape(s.shape)
        assert torch.equal(sent[n] != 0, mask & (s != 0))  # sent exactly where gating says
        assert torch.equal(new_error[n][~mask], s[~mask])
        if value_format == "fp32":
            assert torch.equal(sent[n][mask], s[mask])
        else:
            assert torch.equal(sent[n][mask], s[mask].to(torch.bfloat16).float())
    assert stats.sent == sum(int(gate(weights[n], error[n] + delta[n]).sum()) for n in weights)
    assert stats.payload_bytes == len(payload)


def test_nothing_visible_sends_nothing() -> None:
    weights, delta, _ = make_case(2, 1e-4)
    zero = {n: torch.zeros_like(t) for n, t in delta.items()}
    payload, new_error, stats = PulseLoCoCodec().compress(zero, None, weights)
    assert stats.sent == 0
    assert same(PulseLoCoCodec().decompress(payload, weights), zero)
    assert same(new_error, zero)


def test_bf16_values_cost_about_ten_bits() -> None:
    weights, delta, error = make_case(3, 1e-3)
    bf16 = PulseLoCoCodec("bf16").compress(delta, error, weights)[2]
    fp32 = PulseLoCoCodec("fp32").compress(delta, error, weights)[2]
    assert 8 * bf16.value_bytes / bf16.sent < 12 < 24 < 8 * fp32.value_bytes / fp32.sent


def test_bad_local_inputs_raise() -> None:
    weights, delta, error = make_case(5, 1e-3)
    with pytest.raises(IncompatibleStates):
        PulseLoCoCodec().compress({**delta, "a.weight": delta["a.weight"][:1]}, error, weights)
    with pytest.raises(IncompatibleStates):
        PulseLoCoCodec().compress({**delta, "extra": delta["b.bias"]}, error, weights)
    bad = clone(delta)
    bad["b.bias"][0] = float("nan")
    with pytest.raises(NonFiniteUpdate):
        PulseLoCoCodec().compress(bad, error, weights)


# -- hostile payloads: the specific exception, and nothing the caller owns changes ----------------


@pytest.fixture(scope="module")
def case() -> tuple[StateDict, bytes]:
    weights, delta, error = make_case(6, 3e-4)
    return weights, PulseLoCoCodec().compress(delta, error, weights)[0]


def rejects(payload: bytes, weights: StateDict, exc: type[Exception], **kw: int) -> None:
    before = clone(weights)
    with pytest.raises(exc) as info:
        PulseLoCoCodec().decompress(payload, weights, **kw)
    assert info.type is exc, f"expected {exc.__name__}, got {info.type.__name__}: {info.value}"
    assert same(weights, before)


def test_header_lies(case: tuple[StateDict, bytes]) -> None:
    weights, payload = case
    rejects(payload[:4] + b"\x01" + payload[5:], weights, UnknownVersion)  # version 1: the old coder
    digest_at = 6  # magic, version, one-byte tensor count
    rejects(payload[:digest_at] + bytes(8) + payload[digest_at + 8 :], weights, LayoutMismatch)
    rejects(payload[:14] + b"\x07" + payload[15:], weights, MalformedPayload)  # value format byte
    transposed = {**weights, "a.weight": torch.zeros(48, 64, dtype=torch.bfloat16)}  # same count, other shape
    rejects(payload, transposed, LayoutMismatch)


GAP_CODE = positions.code_of(0, 5)  # b = 0 and a middle geometric model: any gap can be coded


def craft(
    weights: StateDict,
    gaps: np.ndarray,
    values: np.ndarray,
    code: int = GAP_CODE,
    k_claim: int | None = None,
    cut_words: int = 0,
) -> bytes:
    """A PULSELoCo payload sending positions (gaps in context class 0..) of the first tensor only;
    `cut_words` drops that many words from the end of the values stream (its length says so)."""
    w = Writer()
    w.raw(b"PLOC")
    w.u8(PulseLoCoCodec.version)
    w.varint(len(weights))
    w.raw(layout_digest(weights))
    w.u8(0)  # FP32 values
    names = sorted(weights)
    ctx0 = int((weights[names[0]].reshape(-1)[0].view(torch.int16).item() >> 7) & 0xFF)
    k = np.array([k_claim or len(gaps)])
    write_table(w, ClassTable(np.array([ctx0]), k, np.array([code])))
    for _ in names[1:]:
        w.varint(0)
    raw = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.int64)
    ctx = np.full(len(values), ctx0)
    sym = (raw >> 31) * 256 + ((ctx - ((raw >> 23) & 0xFF)) & 0xFF)  # by hand: split() refuses inf/NaN
    models = floatcode.Models(np.array([ctx0]), np.bincount(sym, minlength=floatcode.ALPHABET)[None, :])
    floatcode.write_models(w, models)
    enc = AnsEncoder()
    coded_as = code if code <= positions.MAX_CODE else GAP_CODE  # an unknown code byte lies in the table only
    positions.encode_gaps(enc, gaps, np.array([len(gaps)]), np.array([coded_as]))  # one group: the class
    write_words(w, enc.finish())
    enc = AnsEncoder()
    floatcode.encode(enc, floatcode.Coded(sym, raw & 0x7FFFFF, ctx, models), 23)
    words = enc.finish()
    write_words(w, words[: len(words) - cut_words])
    return w.getvalue()


def test_out_of_range_positions_and_non_finite_values() -> None:
    a = torch.tensor([0.5] * 8 + [1.0] * 8, dtype=torch.bfloat16)  # two exponent classes of 8
    weights = {"a": a, "b": torch.ones(4, dtype=torch.bfloat16)}
    ok = np.array([1.0, 2.0], dtype=np.float32)
    out = PulseLoCoCodec().decompress(craft(weights, np.array([0, 3]), ok), weights)  # the crafter itself works
    assert out["a"][0] == 1.0 and out["a"][4] == 2.0
    rejects(craft(weights, np.array([0, 40]), ok), weights, InvalidPositions)  # gap past the class
    rejects(craft(weights, np.array([5, 5]), ok), weights, InvalidPositions)  # last rank past the class
    rejects(craft(weights, np.zeros(9, dtype=np.int64), np.ones(9, np.float32)), weights, InvalidPositions)
    rejects(craft(weights, np.zeros(17, dtype=np.int64), np.ones(17, np.float32)), weights, SizeLimitExceeded)
    rejects(craft(weights, np.array([0, 3]), np.array([1.0, np.inf], np.float32)), weights, NonFiniteValues)
    rejects(craft(weights, np.array([0, 3]), np.array([np.nan, 1.0], np.float32)), weights, NonFiniteValues)
    rejects(
        craft(weights, np.zeros(8, dtype=np.int64), np.ones(8, np.float32)), weights, MalformedPayload
    )  # full, coded
    rejects(
        craft(weights, np.zeros(5, dtype=np.int64), np.ones(5, np.float32), code=positions.FULL),
        weights,
        MalformedPayload,
    )
    rejects(
        craft(weights, np.array([0, 3]), ok, code=positions.MAX_CODE + 1), weights, MalformedPayload
    )  # unknown code


def test_values_stream_that_ends_early_is_truncated() -> None:
    """Reading past the last word is an error: the decoder never invents zeros to keep going."""
    a = torch.tensor([0.5] * 8 + [1.0] * 8, dtype=torch.bfloat16)
    weights = {"a": a, "b": torch.ones(4, dtype=torch.bfloat16)}
    values = np.linspace(1.0, 2.0, 6, dtype=np.float32)
    PulseLoCoCodec().decompress(craft(weights, np.zeros(6, dtype=np.int64), values), weights)  # whole: fine
    rejects(craft(weights, np.zeros(6, dtype=np.int64), values, cut_words=1), weights, TruncatedPayload)


def test_tiny_payload_claiming_full_density_is_refused_fast() -> None:
    """Every class of a 4M-weight layout declared fully sent, in a payload of a few hundred bytes:
    refused from the header (the values stream cannot carry 7 mantissa bits per value), before
    any per-position array is built."""
    n = 1 << 22
    weights = {"w": torch.full((n,), 0.5, dtype=torch.bfloat16)}
    ctx0 = int((weights["w"][0].view(torch.int16).item() >> 7) & 0xFF)
    w = Writer()
    w.raw(b"PLOC")
    w.u8(PulseLoCoCodec.version)
    w.varint(1)
    w.raw(layout_digest(weights))
    w.u8(1)  # BF16 values
    write_table(w, ClassTable(np.array([ctx0]), np.array([n]), np.array([positions.FULL])))
    floatcode.write_models(w, floatcode.Models(np.array([ctx0]), np.eye(1, floatcode.ALPHABET, dtype=np.int64) * n))
    write_words(w, np.array([1, 0], dtype=np.uint16))  # an empty positions stream: FULL needs no gap
    write_words(w, np.array([1, 0] + [0] * 100, dtype=np.uint16))
    payload = w.getvalue()
    assert len(payload) < 400
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(SizeLimitExceeded, match="stream holds"):
        PulseLoCoCodec().decompress(payload, weights)
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert elapsed < 2.0 and peak < 8 * 1024 * 1024  # not one array of n entries was built
