"""The codec contract (protocol/codec.py), for every codec in the registry.

Each registered codec must: round-trip (decompress(payload) + new error == carried buffer + delta,
to within one FP32 rounding), produce the same bytes for the same inputs, leave the caller's
tensors alone (compress and decompress), and reject hostile payloads with the specific
`MalformedPayload` subclass: truncation anywhere, trailing bytes, the caller's size cap, another
layout, another codec's payload; a corrupted byte either raises one or decodes to finite tensors
of the right shapes. `framing_problem` finds exactly the errors raised before the body was read
whole, with the same message. Codec-specific properties (gating, top-k, crafted headers) stay in
test_pulseloco.py and test_sparseloco.py; the dense codec's, which has no file of its own, at the end.
"""

from __future__ import annotations

import gc
import weakref
from types import MappingProxyType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec as codec_module
from protocol.codec import REGISTRY, Codec, CodecStats, DenseCodec, ReadOnce, carried_sum, make_codec
from protocol.errors import (
    LayoutMismatch,
    MalformedPayload,
    SizeLimitExceeded,
    TrailingBytes,
    TruncatedPayload,
    UnknownVersion,
)
from protocol.state import State, StateDict

CODECS = sorted(REGISTRY)
# a 2-D tensor of whole 64x64 tiles, a small square one, a 1-D one and one of odd shape
SHAPES = {"attn.weight": (128, 192), "ln.bias": (40,), "odd.weight": (100, 50), "wte.weight": (64, 64)}


def make_case(seed: int, scale: float = 1e-3) -> tuple[StateDict, StateDict, StateDict]:
    """(BF16 weights, FP32 delta, FP32 error buffer); some zero weights, where any update shows."""
    g = torch.Generator().manual_seed(seed)
    weights = {n: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for n, s in SHAPES.items()}
    weights["ln.bias"][:5] = 0
    delta = {n: torch.randn(s, generator=g) * scale for n, s in SHAPES.items()}
    error = {n: torch.randn(s, generator=g) * scale / 4 for n, s in SHAPES.items()}
    return weights, delta, error


def clone(state: State) -> StateDict:
    return {n: t.clone() for n, t in state.items()}


def same(a: State, b: State) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


@pytest.fixture(scope="module", params=CODECS)
def case(request: pytest.FixtureRequest) -> tuple[Codec, StateDict, bytes]:
    codec = make_codec(request.param)
    weights, delta, error = make_case(6)
    return codec, weights, codec.compress(delta, error, weights)[0]


def rejects(codec: Codec, payload: bytes, weights: State, exc: type[Exception], **kw: int) -> None:
    before = clone(weights)
    with pytest.raises(exc) as info:
        codec.decompress(payload, weights, **kw)
    assert info.type is exc, f"{codec.name}: expected {exc.__name__}, got {info.type.__name__}: {info.value}"
    assert not getattr(info.value, "body_read", False)  # found before the body was read whole: cheap
    found = codec.framing_problem(payload, weights, **kw)  # ... so a validator finds it as the body lands
    assert type(found) is exc and str(found) == str(info.value)
    assert same(weights, before)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("with_error", [False, True])
def test_round_trip_keeps_the_error_feedback_invariant(name: str, with_error: bool) -> None:
    codec = make_codec(name)
    weights, delta, error = make_case(1)
    buffer = error if with_error else None
    payload, new_error, stats = codec.compress(delta, buffer, weights)
    sent = codec.decompress(payload, weights)
    carry = getattr(codec, "beta", 1.0) if with_error else 0.0  # SparseLoCo decays its buffer by beta
    assert set(sent) == set(new_error) == set(weights)
    for n, w in weights.items():
        assert sent[n].dtype == new_error[n].dtype == torch.float32 and sent[n].shape == w.shape
        acc = error[n] * carry + delta[n]
        assert torch.allclose(sent[n] + new_error[n], acc, rtol=1e-6, atol=1e-9), n
    assert 0 < stats.sent <= stats.elements == sum(t.numel() for t in weights.values())
    assert stats.payload_bytes == len(payload)
    assert codec.compress(delta, buffer, weights)[0] == payload  # the same inputs give the same bytes


@pytest.mark.parametrize("name", CODECS)
def test_caller_tensors_are_left_alone(name: str) -> None:
    codec = make_codec(name)
    weights, delta, error = make_case(9)
    copies = clone(weights), clone(delta), clone(error)
    payload, new_error, _ = codec.compress(delta, error, weights)
    assert same(weights, copies[0]) and same(delta, copies[1]) and same(error, copies[2])
    sent = codec.decompress(payload, weights)
    assert same(weights, copies[0])
    for n in weights:  # the outputs are the caller's to modify: no view of an input
        for out in (sent[n], new_error[n]):
            assert all(out.data_ptr() != t[n].data_ptr() for t in (weights, delta, error))


@pytest.mark.parametrize("name", CODECS)
def test_a_handed_over_update_streams_through_and_gives_the_same_bytes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one tensor at a time, so the count below is exact (with N cores, N tensors are in flight at once)
    monkeypatch.setattr("protocol.pulseloco.parallel_map", lambda fn, items: [fn(x) for x in items])
    codec = make_codec(name)
    weights, delta, error = make_case(4)
    payload, new_error, _ = codec.compress(delta, error, weights)
    alive: list[int] = []  # at each tensor read: how many input tensors were still alive (weakly watched)

    class Watching(dict[str, torch.Tensor]):
        def pop(self, name: str, *default: object) -> torch.Tensor:  # type: ignore[override]
            gc.collect()
            alive.append(sum(ref() is not None for ref in watched))
            return super().pop(name, *default)  # type: ignore[no-any-return]

    given_delta, given_error = Watching(clone(delta)), Watching(clone(error))
    watched = [weakref.ref(t) for st in (given_delta, given_error) for t in st.values()]
    handed = codec.compress(given_delta, given_error, weights, handover=True)
    assert handed[0] == payload and same(handed[1], new_error)
    assert not given_delta and not given_error  # each tensor was taken out once read
    gc.collect()
    assert all(ref() is None for ref in watched)  # and none is kept by the codec
    # freed as the codec moved on, not at the end: by the last read most inputs were gone
    assert alive[0] == 2 * len(weights) and alive[-1] <= 2, alive


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("handover", [False, True])
def test_bf16_inputs_are_widened_as_read(name: str, handover: bool) -> None:
    """A miner may store its buffer and pseudo-gradient in BF16: the codec widens each tensor when it
    reads it (the rest stay BF16 until then) and codes what their FP32 widening gives."""
    codec = make_codec(name)
    weights, delta, error = make_case(3)
    narrow = lambda st: {n: t.to(torch.bfloat16) for n, t in st.items()}  # noqa: E731
    wide = lambda st: {n: t.float() for n, t in st.items()}  # noqa: E731
    expected = codec.compress(wide(narrow(delta)), wide(narrow(error)), weights)
    unread: list[set[torch.dtype]] = []  # at each read: the dtypes still waiting in the handed dicts

    class Watching(dict[str, torch.Tensor]):
        def pop(self, key: str, *default: object) -> torch.Tensor:  # type: ignore[override]
            unread.append({t.dtype for st in given for t in st.values()})
            return super().pop(key, *default)  # type: ignore[no-any-return]

    given = Watching(narrow(delta)), Watching(narrow(error))
    payload, new_error, _ = codec.compress(*given, weights, handover=handover)
    assert payload == expected[0] and same(new_error, expected[1])
    if handover:
        assert len(unread) == 2 * len(weights) and all(d <= {torch.bfloat16} for d in unread)


def test_a_handover_is_a_dict_read_once() -> None:
    codec = make_codec("dense")
    weights, delta, error = make_case(5)
    with pytest.raises(TypeError, match="dict"):
        codec.compress(MappingProxyType(delta), error, weights, handover=True)
    given = ReadOnce(dict(delta))
    name = next(iter(given))
    given[name]
    with pytest.raises(KeyError, match="read once"):
        given[name]


def test_registry_names_its_codecs() -> None:
    assert {make_codec(name).name for name in CODECS} == set(CODECS)
    assert len({make_codec(name).magic for name in CODECS}) == len(CODECS)
    with pytest.raises(KeyError):
        make_codec("nope")


def test_truncation_anywhere_is_truncation(case: tuple[Codec, StateDict, bytes]) -> None:
    codec, weights, payload = case
    for cut in sorted({*range(0, 64), *range(len(payload) - 40, len(payload)), len(payload) // 2}):
        rejects(codec, payload[:cut], weights, TruncatedPayload)


def test_trailing_bytes_cap_and_layout(case: tuple[Codec, StateDict, bytes]) -> None:
    codec, weights, payload = case
    rejects(codec, payload + b"\x00", weights, TrailingBytes)
    rejects(codec, payload, weights, SizeLimitExceeded, max_bytes=len(payload) - 1)
    rejects(codec, b"XXXX" + payload[4:], weights, UnknownVersion)
    rejects(codec, payload[:4] + bytes([payload[4] + 1]) + payload[5:], weights, UnknownVersion)
    rejects(codec, payload, {**weights, "ln.bias": torch.zeros(41, dtype=torch.bfloat16)}, LayoutMismatch)
    rejects(codec, payload, {n: t for n, t in weights.items() if n != "ln.bias"}, LayoutMismatch)
    for other in CODECS:
        if other != codec.name:
            theirs = make_codec(other).compress(*make_case(6)[1:], weights)[0]
            rejects(codec, theirs, weights, UnknownVersion)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_corruption_never_escapes_the_error_tree(
    case: tuple[Codec, StateDict, bytes], data: st.DataObject
) -> None:
    codec, weights, payload = case
    at = data.draw(st.integers(0, len(payload) - 1))
    bad = payload[:at] + bytes([data.draw(st.integers(0, 255))]) + payload[at + 1 :]
    before = clone(weights)
    framing = codec.framing_problem(bad, weights)
    try:
        out = codec.decompress(bad, weights)
    except MalformedPayload as exc:
        # the same error where it is found before the body was read whole; none where it is found after
        assert (framing is None) == exc.body_read and (framing is None or str(framing) == str(exc))
    else:
        assert framing is None
        assert set(out) == set(weights)
        assert all(out[n].shape == weights[n].shape and bool(torch.isfinite(out[n]).all()) for n in out)
    assert same(weights, before)


@pytest.mark.parametrize("name", [c for c in CODECS if c != "dense"])  # dense has no check to fail there
def test_a_fault_found_after_the_whole_body_was_read_says_so(name: str) -> None:
    """The last byte changed: the body reads whole and decodes, then fails its checks. The error says
    the body was read (the validator counts such a payload as a decode's cost, newcomers.py)."""
    codec = make_codec(name)
    weights, delta, error = make_case(6)
    payload = codec.compress(delta, error, weights)[0]
    with pytest.raises(MalformedPayload) as info:
        codec.decompress(payload[:-1] + bytes([payload[-1] ^ 0xFF]), weights)
    assert info.value.body_read
    assert codec.framing_problem(payload[:-1] + bytes([payload[-1] ^ 0xFF]), weights) is None  # frames whole


# -- the dense codec (DiLoCo): exact, keeps nothing --------------------------------------------


def test_dense_codec_is_exact_and_keeps_no_error() -> None:
    weights, delta, error = make_case(4)
    codec = make_codec("dense")
    assert isinstance(codec, DenseCodec)
    payload, new_error, stats = codec.compress(delta, error, weights)
    out = codec.decompress(payload, weights)
    assert all(torch.equal(out[n], error[n] + delta[n]) and not new_error[n].any() for n in weights)
    assert stats == CodecStats(stats.elements, stats.elements, len(payload), 0, 4 * stats.elements)


@pytest.mark.parametrize("name", CODECS)
def test_the_new_buffer_comes_in_the_asked_dtype_and_no_buffer_is_never_a_whole_zero_state(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    codec = make_codec(name)
    weights, delta, error = make_case(8)
    payload, wide, _ = codec.compress(delta, error, weights)
    narrow = codec.compress(clone(delta), clone(error), weights, error_dtype=torch.bfloat16, handover=True)
    assert narrow[0] == payload and same(narrow[1], {n: t.to(torch.bfloat16) for n, t in wide.items()})
    first = codec.compress(delta, None, weights)
    if name != "dense":  # dense's new buffer is zeros by definition
        monkeypatch.setattr("protocol.codec.zeros_like", lambda *a: pytest.fail("a whole zero buffer was built"))
    assert codec.compress(delta, None, weights)[0] == first[0]


def test_the_carried_sum_is_the_whole_tensor_expression_chunk_by_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    _, delta, error = make_case(2)
    monkeypatch.setattr(codec_module, "SUM_CHUNK", 7)  # chunks that divide no tensor
    for e, d in ((error, delta), ({n: t.to(torch.bfloat16) for n, t in error.items()}, delta)):
        for n in d:
            assert torch.equal(carried_sum(e[n], d[n]), e[n].float() + d[n].float())
            assert torch.equal(carried_sum(e[n], d[n], 0.95), e[n].float() * 0.95 + d[n].float())
