"""pulse bench scale and pulse bench memory on toy sizes: whole rounds with the real pieces, per-phase
seconds and memory, the projection; and the phase recorder they rest on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from node.bench import memory as memory_bench
from node.bench import scale
from node.bench.phases import PhaseRecorder, reset_peak, timed_methods
from node.bench.projection import Measured, Shape, project
from node.learn.train import MemoryConfig
from tests.models import TINY_QWEN

pytest.importorskip("transformers")


def _preset_with_inner_lr(folder: Path, lr: str) -> Path:
    """The home preset at another inner learning rate: at its fine-tuning rate a toy model's updates
    change the loss by ~1e-7, below what float rounding on another CPU can flip, so whether a round
    aggregates would depend on the machine."""
    text = (Path(__file__).parents[1] / "configs" / f"{scale.HOME_PRESET}.toml").read_text()
    changed = text.replace("[train.inner]\nlr = 3e-6", f"[train.inner]\nlr = {lr}")
    assert changed != text, "the preset's inner learning rate moved: update this test"
    (path := folder / "preset.toml").write_text(changed)
    return path


def test_scale_runs_whole_rounds_with_the_real_pieces(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY_QWEN, "max_position_embeddings": 1024}))
    config = _preset_with_inner_lr(tmp_path, "1e-3")
    options = scale.Options(model_dir=tmp_path, config=config, miners=2, submissions="2,4", threads=1)
    result = scale.run(options)
    s = result.summary
    assert s["scaled"] and s["follower_hash_ok"]
    assert [r["submissions"] for r in s["rounds"]] == [2, 4] and [r["copies"] for r in s["rounds"]] == [0, 2]
    assert s["rounds"][0]["aggregated"] >= 1  # the round moved the master: the follower applied a real patch
    assert s["rounds"][1]["aggregated"] >= 1  # copies rejected, their authors still aggregated: the cost is a run's
    assert s["validator_seconds_basis"] == "round of 2 + per-submission steps"
    assert s["miner_seconds_per_round"] > 0 and s["validator_seconds_per_round"] > 0
    assert {"validator_peak_mb_2", "validator_peak_mb_4", "miner_bytes_per_param", "fits_24gb_1_5b"} <= set(s)
    assert s["fits_24gb_basis"] == "projected" and isinstance(s["fits_24gb_1_5b"], bool)
    assert s["miner_state_bytes_per_param"] == 12.0  # the home preset: FP32 weights and gradients, BF16 moments
    assert [p["model"] for p in s["projection"]] == ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-72b"]
    steps = s["rounds"][1]["steps"]
    for step in (
        "intake",
        "inspect",
        "evaluate",
        "decode",
        "forward",
        "aggregate",
        "outer_step",
        "sync_encode",
        "commit",
    ):
        assert steps[step]["calls"] >= 1, step
    assert steps["decode"]["calls"] == 2  # each distinct payload once; copies and later steps read the spill
    assert len(result.tables) == 4


def test_memory_bench_compares_the_options_on_the_same_data() -> None:
    options = memory_bench.Options(regime="pretrain", replicas=2, rounds=1, inner_steps=2, n_layer=1, n_embd=32)
    rows = memory_bench.run(options).summary["regimes"]["pretrain"]
    default = rows["default (today)"]
    assert rows["checkpointing"]["final_loss"] == default["final_loss"]  # exact, on the same assignments
    assert rows["checkpointing"]["activations_per_token"] < default["activations_per_token"]
    assert (default["state_bpp"], rows["bf16 moments"]["state_bpp"]) == (16.0, 12.0)
    assert (default["error_bpp"], rows["bf16 error feedback"]["error_bpp"]) == (4.0, 2.0)


def test_phases_nest_and_hand_their_peak_up() -> None:
    if not reset_peak():
        pytest.skip("no /proc/self/clear_refs here")
    rec = PhaseRecorder(torch.device("cpu"))
    with rec.phase("outer"):
        with rec.phase("inner"):
            block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
            del block
        small = np.ones(2**20 // 8)
        del small
    inner, outer = rec.stats["inner"], rec.stats["outer"]
    # the kernel's resident counters lag (per-CPU batches, high-water mark folded in at unmap), so
    # part of the 64 MiB may go unseen; a recorder that missed the peak would see ~0
    assert inner.host_extra_mb >= 16 and outer.host_peak_mb >= inner.host_peak_mb
    assert inner.calls == outer.calls == 1 and outer.seconds >= inner.seconds


def test_timed_methods_measure_and_restore() -> None:
    class Thing:
        def work(self, x: int) -> int:
            return x + 1

    rec = PhaseRecorder(torch.device("cpu"))
    original = Thing.work
    with timed_methods(rec, [(Thing, "work", "thing.work")]):
        assert Thing().work(1) == 2
    assert Thing.work is original and rec.stats["thing.work"].calls == 1
    with pytest.raises(AttributeError), timed_methods(rec, [(Thing, "gone", "x")]):
        pass


def test_projection_scales_state_by_parameters_and_activations_by_width_and_depth() -> None:
    small = Shape("s", 1000, layers=2, hidden=8, vocab=300)
    big = Shape("b", 4000, layers=4, hidden=16, vocab=300)
    m = Measured(small, 12.0, False, 10.0, 0.0, 6.0, 20.0, 0.0, 3.0)
    p = project(m, big, tokens=100)
    expected = 12.0 * 4000 + 100 * 10.0 * 4 + 4 * 100 * 300 * 4
    assert p.miner_device_gib * 2**30 == pytest.approx(expected)
    assert p.validator_gib * 2**30 == pytest.approx(20.0 * 4000) and p.fits_24gb


def test_scale_skips_later_rounds_past_its_time_budget(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY_QWEN, "max_position_embeddings": 1024}))
    options = scale.Options(model_dir=tmp_path, miners=1, submissions="1,2", threads=1, budget_seconds=1e-9)
    s = scale.run(options).summary
    assert [r["submissions"] for r in s["rounds"]] == [1] and s["skipped_rounds"] == [2]
    assert s["validator_peak_ratio"] is None and s["follower_hash_ok"]


def test_the_host_projection_uses_the_sizes_own_preset_memory() -> None:
    """A 1.5B miner's host is projected with the 1.5B preset's train.memory, not the measured run's:
    the BF16 weights, the buffer and the pseudo-gradient as that preset stores them, plus the codec's
    measured peak per parameter."""
    small = Shape("s", 1000, layers=2, hidden=8, vocab=300)
    m = Measured(small, 12.0, False, 10.0, 0.0, 14.0, 20.0, 0.0, 3.0, codec_bpp=1.5)
    assert project(m, small, 100).miner_host_gib * 2**30 == pytest.approx(14.0 * 1000)  # as measured
    narrow = MemoryConfig(error_feedback="bf16", pseudo_gradient="bf16")
    assert project(m, small, 100, narrow).miner_host_gib * 2**30 == pytest.approx((2 + 2 + 2 + 1.5) * 1000)
    assert project(m, small, 100, MemoryConfig()).miner_host_gib * 2**30 == pytest.approx((2 + 4 + 4 + 1.5) * 1000)
