"""Aggregation (median-norm clipping, mean, one decoded update at a time) and the outer optimizer."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from protocol.codec import make_codec
from protocol.errors import IncompatibleStates, TruncatedPayload
from protocol.state import State
from tests.tracked import Tracked
from validator import outer as outer_module
from validator.aggregate import aggregate, clip_scales, global_norm
from validator.outer import OuterConfig, OuterOptimizer


def updates(scales: list[float]) -> dict[bytes, State]:
    """Payload id -> update with global norm exactly `scale` * 5 (a 3-4-0 vector)."""
    out = {}
    for i, s in enumerate(scales):
        out[bytes([i])] = {"a": torch.tensor([3.0 * s, 4.0 * s]), "b": torch.zeros(2, 2)}
    return out


def test_clips_to_the_median_norm_and_averages() -> None:
    table = updates([1.0, 2.0, 10.0])
    result = aggregate(list(table), lambda p: table[p])
    assert result.norms == [5.0, 10.0, 50.0]
    assert result.clip_to == 10.0 and result.scales == [1.0, 1.0, 0.2]
    assert torch.equal(result.update["a"], torch.tensor([(3 + 6 + 6) / 3, (4 + 8 + 8) / 3]))
    assert result.update["a"].dtype == torch.float32 and not result.update["b"].any()


def test_zero_updates_and_even_counts() -> None:
    median, scales = clip_scales([0.0, 2.0, 4.0, 6.0])
    assert median == 3.0 and scales == [1.0, 1.0, 0.75, 0.5]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=12))
def test_no_clipped_norm_exceeds_the_median(norms: list[float]) -> None:
    median, scales = clip_scales(norms)
    # median / n can fall below the smallest normal float and lose relative precision there; such
    # products are within a subnormal step of the median, which is what `abs_tol` allows
    assert all(
        n * s <= median or math.isclose(n * s, median, rel_tol=1e-12, abs_tol=1e-300)
        for n, s in zip(norms, scales, strict=True)
    )


def test_one_decoded_update_at_a_time_and_norms_skip_a_pass() -> None:
    table = updates([1.0, 3.0, 2.0, 5.0])
    calls: list[bytes] = []

    def decode(p: bytes) -> State:
        calls.append(p)
        return Tracked(table[p])

    Tracked.alive = Tracked.peak = 0
    aggregate(list(table), decode)
    assert Tracked.peak == 1 and len(calls) == 8
    calls.clear()
    aggregate(list(table), decode, norms=[global_norm(u) for u in table.values()])
    assert len(calls) == 4
    with pytest.raises(ValueError):
        aggregate(list(table), decode, norms=[1.0])
    with pytest.raises(ValueError):
        aggregate([], decode)


def test_deterministic_for_an_input_order_with_real_payloads() -> None:
    g = torch.Generator().manual_seed(0)
    weights = {
        "w": (torch.randn(64, 64, generator=g) * 0.02).to(torch.bfloat16),
        "g": torch.ones(64, dtype=torch.bfloat16),
    }
    codec = make_codec("sparseloco")
    payloads = [
        codec.compress({n: torch.randn(t.shape, generator=g) * 1e-3 for n, t in weights.items()}, None, weights)[0]
        for _ in range(5)
    ]
    first = aggregate(payloads, lambda p: codec.decompress(p, weights))
    again = aggregate(payloads, lambda p: codec.decompress(p, weights))
    assert all(torch.equal(first.update[n], again.update[n]) for n in weights)
    manual = [codec.decompress(p, weights) for p in payloads]
    _, scales = clip_scales([global_norm(u) for u in manual])
    for n in weights:
        expect = sum(u[n].double() * s for u, s in zip(manual, scales, strict=True)) / 5
        assert torch.equal(first.update[n], expect.float())
    with pytest.raises(TruncatedPayload):
        aggregate([*payloads, payloads[0][:-3]], lambda p: codec.decompress(p, weights))


# -- the outer optimizer -----------------------------------------------------------------------


def master_and_grads(seed: int) -> tuple[State, list[State]]:
    g = torch.Generator().manual_seed(seed)
    master = {"w": torch.randn(8, 4, generator=g), "b": torch.randn(4, generator=g)}
    grads = [{n: torch.randn(t.shape, generator=g) for n, t in master.items()} for _ in range(4)]
    return master, grads


@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_matches_torch_sgd(momentum: float, nesterov: bool) -> None:
    master, grads = master_and_grads(1)
    outer = OuterOptimizer(OuterConfig(lr=0.7, momentum=momentum, nesterov=nesterov), master)
    params = {n: torch.nn.Parameter(t.clone()) for n, t in master.items()}
    ref = torch.optim.SGD(list(params.values()), lr=0.7, momentum=momentum, nesterov=nesterov)
    for grad in grads:
        outer.step(grad)
        for n, p in params.items():
            p.grad = grad[n].clone()
        ref.step()
    for n in master:
        torch.testing.assert_close(outer.master[n], params[n].detach(), rtol=1e-6, atol=1e-6)
    assert outer.steps == 4 and torch.equal(master["w"], master_and_grads(1)[0]["w"])  # the input is not modified


@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_the_step_in_chunks_is_the_same_bytes(monkeypatch: pytest.MonkeyPatch, momentum: float, nesterov: bool) -> None:
    """The step runs chunk by chunk (cache-sized float64 temporaries): chunks of 5 elements, which
    split every tensor unevenly, give the bytes of one chunk per tensor, step after step."""
    master, grads = master_and_grads(3)
    cfg = OuterConfig(lr=0.7, momentum=momentum, nesterov=nesterov)
    whole = OuterOptimizer(cfg, master)
    for grad in grads:
        whole.step(grad)
    monkeypatch.setattr(outer_module, "CHUNK", 5)
    chunked = OuterOptimizer(cfg, master)
    for grad in grads:
        chunked.step(grad)
    for n in master:
        assert torch.equal(whole.master[n], chunked.master[n]) and torch.equal(whole.momentum[n], chunked.momentum[n])
    assert not torch.equal(chunked.master["w"], master["w"])  # it moved


def test_state_round_trip_and_rejections() -> None:
    master, grads = master_and_grads(2)
    cfg = OuterConfig()
    a = OuterOptimizer(cfg, master)
    for grad in grads[:2]:
        a.step(grad)
    b = OuterOptimizer(cfg, a.master)
    b.load_state_tensors(a.state_tensors(), a.steps)
    a.step(grads[2])
    b.step(grads[2])
    assert all(torch.equal(a.master[n], b.master[n]) for n in master) and b.steps == 3
    saved = b.state_tensors()
    with pytest.raises(IncompatibleStates):
        b.load_state_tensors({**saved, "momentum/extra": torch.zeros(1)}, 9)
    with pytest.raises(IncompatibleStates):
        b.load_state_tensors({**saved, "momentum/b": torch.zeros(5)}, 9)
    assert all(torch.equal(saved[k], t) for k, t in b.state_tensors().items()) and b.steps == 3
    with pytest.raises(IncompatibleStates):
        b.step({"w": grads[3]["w"]})
    with pytest.raises(IncompatibleStates):
        OuterOptimizer(cfg, {"w": torch.zeros(2, dtype=torch.bfloat16)})
    assert b.bf16_weights()["w"].dtype == torch.bfloat16


def test_config_is_strict() -> None:
    assert OuterConfig().lr == 0.7 and OuterConfig().momentum == 0.9 and OuterConfig().nesterov
    with pytest.raises(ValidationError):
        OuterConfig(lr="0.7")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        OuterConfig(lr=0.7, beta=0.9)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        OuterConfig(momentum=1.0)
    assert math.isclose(OuterConfig(lr=1.0, momentum=0.0).lr, 1.0)
