"""The rANS coder: exact round trips, integer-exact models, and streams bounded by their length."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import ans
from protocol.ans import AnsDecoder, AnsEncoder, Models
from protocol.errors import MalformedPayload, SizeLimitExceeded, TrailingBytes, TruncatedPayload


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 10**9), min_size=2, max_size=600))
def test_models_are_integer_exact_and_never_near_certain(counts: list[int]) -> None:
    f = ans.normalize(np.array(counts))
    assert int(f.sum()) == ans.TOTAL
    assert f.max() <= ans.MAX_FREQ
    if sum(counts):
        assert all(f[i] >= 1 for i, c in enumerate(counts) if c)


def random_segments(seed: int) -> tuple[Models, list[tuple[str, np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    alphabet = int(rng.integers(2, 70))
    counts = rng.integers(0, 1000, size=(3, alphabet)) * (rng.random((3, alphabet)) < 0.6)
    counts[:, 0] += 1
    models = Models.from_counts(counts)
    segments = []
    for _ in range(int(rng.integers(1, 6))):
        n = int(rng.integers(0, 400))
        if rng.random() < 0.5:
            ids = rng.integers(0, 3, n)
            p = counts[ids] / counts[ids].sum(axis=1, keepdims=True)
            sym = np.array([rng.choice(alphabet, p=row) for row in p], dtype=np.int64)
            segments.append(("cat", sym, ids))
        else:
            nbits = rng.integers(0, 33, n)
            values = rng.integers(0, 1 << 62, n) & ((1 << nbits) - 1)
            segments.append(("bits", values, nbits))
    return models, segments


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_round_trip_and_the_capacity_bound(seed: int) -> None:
    models, segments = random_segments(seed)
    enc = AnsEncoder()
    for kind, a, b in segments:
        enc.categorical(a, models, b) if kind == "cat" else enc.bits(a, b)
    words = enc.finish()
    # what the capacity check assumes of every valid stream: it really holds
    symbols = sum(len(a) for kind, a, _ in segments if kind == "cat")
    raw = sum(int(b.sum()) for kind, _, b in segments if kind == "bits")
    ans.require(words, symbols, raw)
    dec = AnsDecoder(words)
    for kind, a, b in segments:
        got = dec.categorical(models, b) if kind == "cat" else dec.bits(b)
        assert np.array_equal(got, a)
    dec.finish()


def test_near_certain_symbols_still_cost_a_tenth_of_a_bit() -> None:
    models = Models.from_counts(np.array([[10**9, 1]]))
    enc = AnsEncoder()
    enc.categorical(np.zeros(100_000, dtype=np.int64), models, 0)
    words = enc.finish()
    assert 16 * len(words) >= 100_000 * ans.MIN_SYMBOL_BITS
    dec = AnsDecoder(words)
    with pytest.raises(SizeLimitExceeded):
        dec.categorical(models, 0, count=100_000 * 16 * len(words))  # claims far more than it holds


def test_reading_past_the_end_raises_instead_of_inventing_zeros() -> None:
    flat = Models.from_counts(np.ones((1, 16), dtype=np.int64))  # 4 bits a symbol, far above the bound
    enc = AnsEncoder()
    enc.categorical(np.arange(200) % 16, flat, 0)
    words = enc.finish()
    dec = AnsDecoder(words[: len(words) // 2])  # passes the capacity check, runs out half way
    with pytest.raises(TruncatedPayload):
        dec.categorical(flat, 0, count=200)


def test_finish_needs_every_word_and_the_initial_state() -> None:
    enc = AnsEncoder()
    enc.bits(np.arange(50), 8)
    words = enc.finish()
    dec = AnsDecoder(np.concatenate([words, np.array([5], dtype=np.uint16)]))
    dec.bits(8, count=50)
    with pytest.raises(TrailingBytes):
        dec.finish()
    dec = AnsDecoder(words)
    dec.bits(8, count=49)  # one symbol left in the state
    with pytest.raises(MalformedPayload):
        dec.finish()


def test_streams_too_short_for_a_state_are_refused() -> None:
    with pytest.raises(TruncatedPayload):
        AnsDecoder(np.array([7], dtype=np.uint16))
    with pytest.raises(MalformedPayload):
        AnsDecoder(np.array([0, 7], dtype=np.uint16))  # below the smallest state


def test_encoder_refuses_what_it_cannot_code() -> None:
    models = Models.from_counts(np.array([[5, 0, 3]]))
    enc = AnsEncoder()
    with pytest.raises(ValueError):
        enc.categorical(np.array([1]), models, 0)  # zero frequency
    with pytest.raises(ValueError):
        enc.bits(np.array([4]), 2)  # does not fit


def test_import_time_tables_match_the_compiled_ones() -> None:
    rng = np.random.default_rng(5)
    for alphabet in (4, 65, 512):
        counts = rng.integers(0, 1000, size=(3, alphabet)) * (rng.random((3, alphabet)) < 0.5)
        counts[:, 1] += 1
        a, b = Models.from_counts(counts), Models.from_counts(counts, compiled=False)
        assert all(np.array_equal(x, y) for x, y in zip(vars(a).values(), vars(b).values(), strict=True))


def test_warm_up_runs_every_codec() -> None:
    from protocol.warmup import warm_up

    assert warm_up() > 0
