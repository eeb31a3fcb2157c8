"""rl: decentralized GRPO (workers, miners, validator, PULSESync) against a single-process GRPO run.

Both runs start from the run's cached warm start and see the same prompts, rollouts per round and
optimizer steps (`rlsim.py`). Per round: held-out reward (greedy, fixed prompt set), the fraction
of BF16 weights the round's patch changed, and the patch's bytes against the dense BF16 weights.

JSON: `reward_start`, `reward_final`, `reward_final_centralized`, `mean_patch_density` (mean over
rounds of the changed fraction), `sync_ratio_vs_dense` (patch bytes / dense BF16 bytes, summed
over rounds: 0.01 means 100x smaller), the per-round series, and each target with met or missed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from node.bench.report import BenchResult, table
from node.bench.rlsim import RunRecord, Shape, centralized, decentralized
from node.run.manifest import Manifest, load_manifest, parse_manifest
from node.run.presets import preset
from protocol.parsing import STRICT

log = logging.getLogger(__name__)

DEFAULT_CONFIG = preset("rl")
CLEAR_RISE = 0.05  # "clearly above the warm start": at least this much held-out reward gained
CENTRALIZED_TOLERANCE = 0.05  # final reward at least (1 - this) x the centralized run's
DENSITY_TARGET = 0.02  # mean fraction of BF16 weights a sync changes, at lr <= 3e-6


class Options(BaseModel):
    """`pulse bench rl`'s options: the run's shape, and overrides of the manifest's settings."""

    model_config = STRICT

    config: Path = DEFAULT_CONFIG
    """run manifest with task = 'rl'"""
    rounds: int = Field(default=30, ge=1)
    """rounds of each run"""
    workers: int = Field(default=4, ge=1)
    """inference workers (rollout batches per round)"""
    miners: int = Field(default=4, ge=1)
    """GRPO miners"""
    inner_steps: int | None = Field(default=None, ge=1)
    """H (default: the manifest's)"""
    inner_lr: float | None = Field(default=None, gt=0)
    """inner AdamW lr (default: the manifest's)"""
    outer_lr: float | None = Field(default=None, gt=0)
    """outer lr (default: the manifest's)"""
    outer_momentum: float | None = Field(default=None, ge=0, lt=1)
    """outer momentum (default: the manifest's)"""
    prompts: int | None = Field(default=None, ge=1)
    """prompts per worker batch (default: the manifest's)"""
    groups_per_batch: int | None = Field(default=None, ge=1)
    """groups a seed draws from the pool (default: the manifest's)"""
    group_size: int | None = Field(default=None, ge=1)
    """G (default: the manifest's)"""
    held_out: int | None = Field(default=None, ge=1)
    """held-out prompts (default: the manifest's)"""
    cache_dir: Path | None = None
    """warm-start cache (default: ~/.cache/pulse)"""
    threads: int = Field(default=2, ge=1)
    """torch CPU threads"""
    save: Path | None = None
    """also write the JSON summary to this file"""
    skip_centralized: bool = False
    """only the decentralized run"""

    @property
    def shape(self) -> Shape:
        """Both runs' shape: rollout batches, miners and rounds."""
        return Shape(workers=self.workers, miners=self.miners, rounds=self.rounds)


def manifest_for(options: Options) -> Manifest:
    """The manifest with the options' overrides (a different run id when any is given)."""
    manifest = load_manifest(options.config)
    if manifest.task != "rl":
        raise SystemExit(f"{options.config}: task is {manifest.task!r}, the rl bench needs task = 'rl'")
    data = manifest.model_dump(mode="python")
    for value, section, key in [
        (options.inner_steps, "train", "inner_steps"),
        (options.prompts, "rl", "prompts_per_batch"),
        (options.group_size, "rl", "group_size"),
        (options.groups_per_batch, "rl", "groups_per_batch"),
        (options.held_out, "rl", "held_out_prompts"),
    ]:
        if value is not None:
            data[section][key] = value
    if options.inner_lr is not None:
        data["train"]["inner"]["lr"] = options.inner_lr
    if options.outer_lr is not None:
        data["train"]["outer"]["lr"] = options.outer_lr
    if options.outer_momentum is not None:
        data["train"]["outer"]["momentum"] = options.outer_momentum
    return parse_manifest(data, str(options.config))


def run(options: Options) -> BenchResult:
    torch.set_num_threads(options.threads)
    manifest = manifest_for(options)
    shape = options.shape
    progress = log.info
    dec = decentralized(manifest, shape, options.cache_dir, progress)
    cen = None if options.skip_centralized else centralized(manifest, shape, options.cache_dir, progress)
    out = result(manifest, shape, dec, cen)
    if options.save is not None:
        options.save.write_text(json.dumps(out.summary, sort_keys=True) + "\n")
    return out


def summary(manifest: Manifest, shape: Shape, dec: RunRecord, cen: RunRecord | None) -> dict[str, Any]:
    rows = dec.rows
    final = rows[-1].reward
    final_c = cen.rows[-1].reward if cen is not None else None
    density = sum(r.density for r in rows) / len(rows)
    ratio = sum(r.patch_bytes for r in rows) / sum(r.dense_bytes for r in rows)
    out: dict[str, Any] = {
        "reward_start": dec.reward_start,
        "reward_final": final,
        "reward_final_centralized": final_c,
        "mean_patch_density": density,
        "sync_ratio_vs_dense": ratio,
        "sync_x_smaller_than_dense": 1 / ratio if ratio > 0 else None,
        "rewards": [r.reward for r in rows],
        "rewards_centralized": [r.reward for r in cen.rows] if cen is not None else None,
        "rollout_rewards": [r.rollout_reward for r in rows],
        "patch_density": [r.density for r in rows],
        "patch_bytes": [r.patch_bytes for r in rows],
        "dense_bf16_bytes": rows[0].dense_bytes,
        "aggregated": [r.aggregated for r in rows],
        "miner_payload_bytes": sum(r.payload_bytes for r in rows) / len(rows),
        "miner_sent_fraction": sum(r.payload_density for r in rows) / len(rows),
        "centralized_density_per_round": sum(r.density for r in cen.rows) / len(cen.rows) if cen is not None else None,
        "centralized_density_per_step": cen.step_density if cen is not None else None,
        "hashes_agree": all(r.hashes_agree for r in rows),
        "rejected_batches": dec.rejected_batches,
        "seconds": dec.seconds,
        "seconds_centralized": cen.seconds if cen is not None else None,
        "validator_seconds_per_round": dec.validator_seconds / len(rows),
        "settings": {
            "workers": shape.workers,
            "miners": shape.miners,
            "rounds": shape.rounds,
            "inner_steps": manifest.train.inner_steps,
            "inner_lr": manifest.train.inner.lr,
            "outer": manifest.train.outer.model_dump(),
            "codec": manifest.train.codec,
            "rl": manifest.rl.model_dump(),
            "gpt": manifest.model.gpt.model_dump(),
        },
    }
    out["targets"] = {
        "reward_rises": final >= dec.reward_start + CLEAR_RISE,
        "within_5pct_of_centralized": None if final_c is None else final >= (1 - CENTRALIZED_TOLERANCE) * final_c,
        "density_at_most_2pct": density <= DENSITY_TARGET,
    }
    return out


def result(manifest: Manifest, shape: Shape, dec: RunRecord, cen: RunRecord | None) -> BenchResult:
    s = summary(manifest, shape, dec, cen)
    per_round = [
        [
            r.round + 1,
            f"{r.reward:.3f}",
            f"{cen.rows[i].reward:.3f}" if cen is not None else "-",
            f"{r.rollout_reward:.3f}",
            r.aggregated,
            f"{100 * r.density:.2f}%",
            f"{r.patch_bytes:,}",
            f"{r.dense_bytes / max(r.patch_bytes, 1):.0f}x",
            f"{r.payload_bytes:,.0f}",
            f"{100 * r.payload_density:.2f}%",
        ]
        for i, r in enumerate(dec.rows)
    ]
    columns = ["round", "reward", "central", "rollouts", "agg", "changed", "patch B", "vs dense", "payload B", "sent"]
    m = manifest
    title = (
        f"rl: {shape.workers} workers x {m.rl.prompts_per_batch} prompts x G={m.rl.group_size}, {shape.miners} miners "
        f"x H={m.train.inner_steps} at lr {m.train.inner.lr:g}, {m.train.codec}, outer lr {m.train.outer.lr:g} "
        f"momentum {m.train.outer.momentum:g}; held-out reward (greedy, {m.rl.held_out_prompts} prompts) "
        f"{dec.reward_start:.3f} at the warm start"
    )
    targets = s["targets"]
    final_c = s["reward_final_centralized"]
    lines = [
        ["held-out reward: start -> final", f"{s['reward_start']:.3f} -> {s['reward_final']:.3f}",
         f">= +{CLEAR_RISE}", _verdict(targets["reward_rises"])],
        ["final reward, single-process GRPO", "-" if final_c is None else f"{final_c:.3f}",
         f"decentralized >= {1 - CENTRALIZED_TOLERANCE:.2f}x", _verdict(targets["within_5pct_of_centralized"])],
        ["mean patch density", f"{100 * s['mean_patch_density']:.2f}%", f"<= {100 * DENSITY_TARGET:.0f}%",
         _verdict(targets["density_at_most_2pct"])],
        ["BF16 weights changed per optimizer step / per round, single process",
         "-" if cen is None
         else f"{100 * (cen.step_density or 0):.2f}% / {100 * s['centralized_density_per_round']:.2f}%",
         "", ""],
        ["bytes per sync / dense BF16", f"{s['sync_ratio_vs_dense']:.4f} ({s['sync_x_smaller_than_dense'] or 0:.0f}x)",
         "", ""],
        ["state hashes agree (workers, miners, validator)", s["hashes_agree"], "", ""],
        ["seconds: decentralized / centralized", f"{s['seconds']:.0f} / "
         + ("-" if s["seconds_centralized"] is None else f"{s['seconds_centralized']:.0f}"), "", ""],
    ]  # fmt: skip
    return BenchResult(
        summary=s,
        tables=[table(title, columns, per_round), table("rl: figures", ["figure", "measured", "target", ""], lines)],
    )


def _verdict(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "MISSED")
