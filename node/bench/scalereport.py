"""The figures of a finished `pulse bench scale` run: round times at the preset's sizes, memory per role,
bytes on the wire, the projection, and the tables.

Round times at the preset's sizes (`scale.py` says how they are measured and scaled):

    miner     = train_run - H_run x (step(T_run) + opt) + H x (step(T) + opt) + compress
    validator = round_run - forward_run + forwards x forward(T_eval)  (+ copies' missing decodes)

where step(T) and forward(T) are the calibration lines and opt the timed optimizer step; with
the preset's own sizes nothing is scaled and the measured seconds are reported as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from node.bench.phases import MB
from node.bench.projection import Measured, Projection, Shape, fits_measured, project
from node.bench.report import BenchResult, table
from node.learn.train import MemoryConfig
from node.run.manifest import load_manifest
from node.run.presets import preset
from protocol.codec import numel

if TYPE_CHECKING:
    from node.bench.scale import Bench, RoundRecord

PROJECTED = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-72b")
SIZE_PRESETS = {"qwen2.5-1.5b": "qwen2.5-1.5b-home-gpu"}  # a size with its own preset: its memory settings


def projection_memory(b: Bench, name: str) -> tuple[str, MemoryConfig]:
    """(preset, train.memory) a projection to architecture `name` is made with: the size's own preset
    where there is one, else the measured preset's."""
    own = SIZE_PRESETS.get(name)
    if own is None:
        return b.s.preset.name, b.s.run.train.memory
    return own, load_manifest(preset(own)).train.memory


def miner_round_seconds(b: Bench) -> float:
    stats, p, r = b.rec.stats, b.s.preset, b.s.run
    train = stats["miner.train"].seconds / stats["miner.train"].calls
    compress = stats["miner.compress"].seconds / stats["miner.compress"].calls
    if not b.s.scaled or b.calibration is None:
        return train + compress
    c = b.calibration
    step_run = c.train_seconds(r.data.batch_size * r.data.seq_len) + c.optimizer_seconds
    step_preset = c.train_seconds(p.data.batch_size * p.data.seq_len) + c.optimizer_seconds
    fixed = max(train - r.train.inner_steps * step_run, 0.0)  # loading W_r, the delta
    return fixed + p.train.inner_steps * step_preset + compress


def forward_rescale(b: Bench, rnd: RoundRecord) -> float:
    """Seconds to add to a round so that its forward passes take what they take at the preset's batch."""
    if not b.s.scaled or b.calibration is None:
        return 0.0
    tokens = b.s.preset.selection.eval_batch_size * b.s.preset.data.seq_len
    return rnd.step_calls("forward") * b.calibration.eval_seconds(tokens) - rnd.step_seconds("forward")


def validator_round_seconds(b: Bench, rnd: RoundRecord) -> float:
    """The round at the preset's evaluation batch, as if every submission had been an honest miner's."""
    decode = rnd.step_seconds("decode") / max(rnd.step_calls("decode"), 1)
    # a round decodes each distinct payload once (the steps after read it back from the spill), so an
    # honest submission in a copy's place would have cost one more decode
    return rnd.seconds + forward_rescale(b, rnd) + rnd.copies * decode


def validator_seconds_8(b: Bench) -> tuple[float, str]:
    """(seconds for a round of 8 honest submissions, how it was obtained)."""
    by_size = {r.size: r for r in b.rounds}
    if 8 in by_size:
        return validator_round_seconds(b, by_size[8]), "measured round of 8"
    base = by_size[min(by_size)]
    whole = validator_round_seconds(b, base)
    missing_decodes = whole - base.seconds - forward_rescale(b, base)  # the copies' (0 without copies)
    steps = sum(base.step_seconds(k) for k in ("inspect", "evaluate", "aggregate")) + forward_rescale(b, base)
    extra = (8 - base.size) * (steps + missing_decodes) / base.size  # the per-submission steps, at the base's rate
    return whole + extra, f"round of {base.size} + per-submission steps"


def own_peak_mb(rnd: RoundRecord) -> float:
    """The validator's own peak: above what was resident before it opened its state, plus its inputs."""
    return rnd.peak_mb - rnd.start_mb + rnd.input_bytes / MB


def measured_costs(b: Bench) -> Measured:
    assert b.calibration is not None
    miner, c, params = b.miners[0], b.calibration, b.miners[0].state.params
    shape = Shape.of(b.s.run.model.architecture or "measured", b.setup.hf_config)
    t_run = c.train[0].tokens
    memory = b.s.run.train.memory
    compress = b.rec.stats["miner.compress"]
    weights = sum(t.numel() * t.element_size() for t in b.weights.values())
    host = weights + miner.state.error_bytes + miner.delta_bytes + compress.host_extra_mb * MB
    largest = max(b.rounds, key=lambda r: r.size)
    follower = b.rec.stats["follower.apply"]
    return Measured(
        shape=shape,
        state_bpp=(miner.state.weight_bytes + c.train[0].grad_bytes + miner.state.optimizer_bytes) / params,
        autocast_cache=b.s.run.model.precision == "bf16-autocast" and not memory.checkpointing,
        saved_per_token=c.train[0].activation_bytes / t_run,
        block_per_token=(c.full_activation.activation_bytes / t_run / shape.layers) if c.full_activation else 0.0,
        host_bpp=host / params,
        validator_bpp=own_peak_mb(largest) * MB / params,
        validator_device_bpp=largest.device_peak_mb * MB / params,
        follower_bpp=(weights + follower.host_extra_mb * MB) / params,
        codec_bpp=compress.host_extra_mb * MB / params,
    )


def summarize(b: Bench) -> BenchResult:
    m = measured_costs(b)
    p = b.s.preset
    tokens = p.data.batch_size * p.data.seq_len
    memories = {name: projection_memory(b, name) for name in PROJECTED}
    projections = [project(m, Shape.of(name), tokens, memories[name][1]) for name in PROJECTED]
    miner_s = miner_round_seconds(b)
    val_s, val_basis = validator_seconds_8(b)
    peaks = {r.size: own_peak_mb(r) for r in b.rounds}
    train = b.rec.stats["miner.train"]
    measured_device = b.s.device.type == "cuda" and not b.s.scaled
    miner_device = train.device_peak_mb * MB if measured_device else projections[0].miner_device_gib * 2**30
    fits, basis = _fits(b, projections[1])
    summary: dict[str, Any] = {
        "miner_seconds_per_round": miner_s,
        "validator_seconds_per_round": val_s,
        "validator_seconds_basis": val_basis,
        "validator_keeps_up": val_s < miner_s,
        "scaled": b.s.scaled,
        **{f"validator_peak_mb_{n}": v for n, v in peaks.items()},
        "validator_peak_ratio": max(peaks.values()) / min(peaks.values()) if len(peaks) > 1 else None,
        "skipped_rounds": b.skipped,
        "validator_device_peak_mb": max(r.device_peak_mb for r in b.rounds),
        "miner_bytes_per_param": miner_device / m.shape.params,
        "miner_bytes_per_param_basis": "measured" if measured_device else "projected to the preset's batch",
        "miner_state_bytes_per_param": m.state_bpp,
        "miner_host_bytes_per_param": m.host_bpp,
        "miner_host_codec_bytes_per_param": m.codec_bpp,
        "fits_24gb_1_5b": fits,
        "fits_24gb_basis": basis,
        "follower_hash_ok": b.follower_ok,
        **_bytes(b),
        "rounds": [_round_json(b, r) for r in b.rounds],
        "measured_1_5b": b.measured_1_5b,
        "projection": [_projection_json(x, *memories[x.shape.name]) for x in projections],
        "phases": {
            k: {
                "calls": v.calls,
                "seconds": v.seconds,
                "cpu_seconds": v.cpu_seconds,
                "host_peak_mb": v.host_peak_mb,
                "host_extra_mb": v.host_extra_mb,
                "device_peak_mb": v.device_peak_mb,
            }
            for k, v in b.rec.stats.items()
        },
        "settings": _settings(b),
    }
    return BenchResult(summary, _tables(b, summary, m, projections))


def _fits(b: Bench, p15: Projection) -> tuple[bool, str]:
    if b.measured_1_5b is not None:
        return fits_measured(b.measured_1_5b["reserved_peak_mb"]), "measured"
    return p15.fits_24gb, "projected"


def _bytes(b: Bench) -> dict[str, Any]:
    n = numel(b.weights)
    payloads = [m.payload_bytes for m in b.miners]
    patch = len(b.rounds[0].report.patch)
    return {
        "params": n,
        "payload_bytes_mean": sum(payloads) / len(payloads),
        "payload_vs_dense_fp32": 4 * n * len(payloads) / sum(payloads),
        "patch_bytes": patch,
        "patch_vs_dense_bf16": 2 * n / patch,
        "miner_loss_mean": sum(m.loss for m in b.miners) / len(b.miners),
    }


def _round_json(b: Bench, r: RoundRecord) -> dict[str, Any]:
    return {
        "submissions": r.size,
        "copies": r.copies,
        "aggregated": len(r.report.selected()),
        "seconds_run": r.seconds,
        "seconds_at_preset": validator_round_seconds(b, r),
        "own_peak_mb": own_peak_mb(r),
        "device_peak_mb": r.device_peak_mb,
        "steps": {k: {"calls": c, "seconds": s} for k, (c, s) in sorted(r.steps.items())},
    }


def _projection_json(x: Projection, preset_name: str, memory: MemoryConfig) -> dict[str, Any]:
    return {
        "memory_of": preset_name,  # the miner host is projected with this preset's train.memory
        "memory": memory.model_dump(),
        "model": x.shape.name,
        "params": x.shape.params,
        "miner_device_gib": x.miner_device_gib,
        "miner_host_gib": x.miner_host_gib,
        "validator_gib": x.validator_gib,
        "validator_device_gib": x.validator_device_gib,
        "follower_gib": x.follower_gib,
        "fits_24gb": x.fits_24gb,
    }


def _memory_label(row: dict[str, Any]) -> str:
    """Which preset's host settings a projection row uses, in a few words."""
    memory = row["memory"]
    return f"{row['memory_of']}: buffer {memory['error_feedback']}, pseudo-gradient {memory['pseudo_gradient']}"


def _settings(b: Bench) -> dict[str, Any]:
    p, r = b.s.preset, b.s.run
    return {
        "device": str(b.s.device),
        "architecture": r.model.architecture or r.model.path,
        "miners": b.s.miners,
        "submissions": list(b.s.sizes),
        "run": {
            "inner_steps": r.train.inner_steps,
            "batch_size": r.data.batch_size,
            "seq_len": r.data.seq_len,
            "eval_batch_size": r.selection.eval_batch_size,
        },
        "preset": {
            "name": p.name,
            "inner_steps": p.train.inner_steps,
            "batch_size": p.data.batch_size,
            "seq_len": p.data.seq_len,
            "eval_batch_size": p.selection.eval_batch_size,
        },
        "memory": r.train.memory.model_dump(),
        "codec": r.train.codec,
        "precision": r.model.precision,
    }


def _tables(b: Bench, s: dict[str, Any], m: Measured, projections: list[Projection]) -> list[Any]:
    run, pre = s["settings"]["run"], s["settings"]["preset"]
    scaled = " (scaled to the preset)" if b.s.scaled else ""
    peaks = sorted((k, v) for k, v in s.items() if k.startswith("validator_peak_mb_"))
    headline = [
        ["miner s/round: H steps + compress" + scaled, s["miner_seconds_per_round"], ""],
        ["validator s/round, 8 submissions" + scaled, s["validator_seconds_per_round"], "< miner"],
        ["validator keeps up", s["validator_keeps_up"], "yes"],
        [
            "validator own peak MB, " + " / ".join(k.rsplit("_", 1)[1] for k, _ in peaks) + " submissions",
            " / ".join(f"{v:.0f}" for _, v in peaks),
            "16 <= 1.1 x 4",
        ],
        ["miner device bytes/param (" + s["miner_bytes_per_param_basis"] + ")", s["miner_bytes_per_param"], ""],
        ["1.5B miner fits 24 GB (" + s["fits_24gb_basis"] + ")", s["fits_24gb_1_5b"], "yes"],
        ["follower: patch applied, state hash checked", s["follower_hash_ok"], "yes"],
        [
            "payload bytes per miner / x smaller than dense FP32",
            f"{s['payload_bytes_mean']:.0f} / {s['payload_vs_dense_fp32']:.1f}x",
            "",
        ],
        ["patch bytes / x smaller than dense BF16", f"{s['patch_bytes']} / {s['patch_vs_dense_bf16']:.1f}x", ""],
    ]
    phases = [
        [
            k,
            v.calls,
            v.seconds / max(v.calls, 1),
            v.cpu_seconds / max(v.calls, 1),
            v.host_peak_mb,
            v.host_extra_mb,
            v.device_peak_mb,
        ]
        for k, v in b.rec.stats.items()
    ]
    per_param = [
        ["weights + gradients + optimizer state (device)", m.state_bpp, "measured tensors"],
        ["activations kept for backward, per token", m.saved_per_token, "measured (saved-tensor hooks)"],
        ["one recomputed block, per token", m.block_per_token, "measured"],
        ["host: BF16 global weights, error buffer, delta, codec work", m.host_bpp, "measured"],
        ["host: the codec's peak above them", m.codec_bpp, "measured"],
        ["validator (own peak) per parameter", m.validator_bpp, "measured"],
        ["follower per parameter", m.follower_bpp, "measured"],
    ]
    proj = [
        [
            x.shape.name,
            f"{x.shape.params / 1e9:.2f}B",
            x.miner_device_gib,
            x.miner_host_gib,
            x.validator_gib,
            x.follower_gib,
            x.fits_24gb,
            _memory_label(row),
        ]
        for x, row in zip(projections, s["projection"], strict=True)
    ]
    return [
        table(
            f"scale: {s['settings']['architecture']} on {b.s.device}, run H={run['inner_steps']} "
            f"{run['batch_size']}x{run['seq_len']}, preset H={pre['inner_steps']} {pre['batch_size']}x{pre['seq_len']}",
            ["figure", "value", "target"],
            headline,
        ),
        table(
            "scale: phases (seconds per call, MB)",
            ["phase", "calls", "s/call", "CPU s/call", "host peak", "host extra", "device peak"],
            phases,
        ),
        table("scale: bytes per parameter at the measured size", ["what", "bytes", "how"], per_param),
        table(
            f"scale: projection at the preset's step ({pre['batch_size']}x{pre['seq_len']} tokens), GiB",
            ["model", "params", "miner GPU", "miner host", "validator", "follower", "miner fits 24 GB", "host at"],
            proj,
        ),
    ]
