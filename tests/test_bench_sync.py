"""`pulse bench sync` end to end on a tiny trace: the JSON it prints is complete and truthful."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from node.bench import plainpatch
from node.bench.trace import write_trace
from node.commands.cli import main


def tiny_trace(path: Path, steps: int) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen) * 0.02
    ln = torch.ones(128)
    states = []
    for _ in range(steps + 1):
        states.append({"w": w.bfloat16(), "ln": ln.bfloat16()})
        w = w - 3e-6 * torch.randn(w.shape, generator=gen)
        ln = ln - 1e-3 * torch.randn(ln.shape, generator=gen)
    write_trace(path, states, {"lr": 1e-6, "steps": steps})


def test_sync_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny_trace(tmp_path, steps=4)
    args = ["bench", "sync", "--json", "--trace", str(tmp_path), "--steps", "4", "--delay", "2", "--repeat", "1"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    for key in [
        "lossless",
        "density",
        "bits_per_changed",
        "baseline_bits_per_changed",
        "bound_bits_per_changed",
        "order0_bound_bits_per_changed",
        "ratio_vs_dense",
        "encode_gbps",
        "decode_gbps",
        "baseline_encode_gbps",
        "baseline_decode_gbps",
        "apply_gbps",
        "memcpy_gbps",
        "state_mb",
        "peak_extra_mb",
    ]:
        assert key in out, key
    assert out["lossless"] is True
    assert out["state_mb"] == pytest.approx(2 * (64 * 128 + 128) / 1e6)
    assert out["apply_gbps"] > 0 and out["memcpy_gbps"] > 0 and out["peak_extra_mb"] >= 0
    assert set(out["targets"]) >= {"encode_at_least_plain", "apply_at_least_half_plain_decode", "lossless"}
    assert out["pairs"] == 3
    assert 0 < out["density"] < 0.5
    assert out["bound_bits_per_changed"] < out["order0_bound_bits_per_changed"]
    assert out["bits_per_changed"] < out["baseline_bits_per_changed"]


def test_sync_bench_refuses_a_trace_for_another_lr(tmp_path: Path) -> None:
    tiny_trace(tmp_path, steps=2)
    with pytest.raises(SystemExit, match="another lr"):
        main(["bench", "sync", "--trace", str(tmp_path), "--lr", "3e-6", "--steps", "2"])


def test_plain_encoding_round_trips_on_either_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline must be lossless too, on its numpy path and on its torch (device) path."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(40, 50, generator=gen) * 0.02
    old = {"w": w.bfloat16(), "b": torch.zeros(7, dtype=torch.bfloat16)}
    new = {"w": (w - 1e-4 * torch.randn(w.shape, generator=gen)).bfloat16(), "b": old["b"].clone()}
    patch = plainpatch.encode(old, new)
    got = plainpatch.apply(old, patch)
    monkeypatch.setattr(plainpatch.tensorbytes, "on_host", lambda t: False)
    assert plainpatch.encode(old, new) == patch
    forced = plainpatch.apply(old, patch)
    for name in old:
        assert torch.equal(got[name].view(torch.int16), new[name].view(torch.int16))
        assert torch.equal(forced[name].view(torch.int16), new[name].view(torch.int16))
