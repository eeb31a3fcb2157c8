"""`pulse bench rl` on tiny settings, through the library functions the bench runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from node.bench import rl as bench
from node.bench.rlsim import (
    _Holder,
    centralized,
    checked_pool,
    decentralized,
    identity_for,
    publish_batch,
)
from node.learn.model import build_gpt
from node.learn.rl.checks import announce
from node.learn.rl.warmstart import warm_start
from node.learn.train import bf16_state
from node.run.manifest import Manifest
from protocol import rollouts
from protocol.messages import RolloutAnnouncement
from protocol.rollouts import RolloutBatch
from protocol.statehash import state_hash

KEYS = ("reward_start", "reward_final", "reward_final_centralized", "mean_patch_density", "sync_ratio_vs_dense")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rl-cache")


def _tiny(tmp_path: Path) -> tuple[Manifest, bench.Options]:
    options = bench.Options(
        rounds=2, workers=3, miners=3, inner_steps=2, prompts=3, groups_per_batch=3, group_size=4, held_out=8,
        threads=1, cache_dir=tmp_path,
    )  # fmt: skip
    manifest = bench.manifest_for(options)
    data = manifest.model_dump(mode="python")
    data["model"]["gpt"].update(n_layer=1, n_embd=32, n_head=2)
    data["rl"]["warm_start_steps"] = 60  # enough to answer in format sometimes: groups with mixed rewards
    return Manifest.model_validate(data), options


def test_tiny_bench_run_agrees_and_reports(cache: Path) -> None:
    tmp_path = cache
    manifest, options = _tiny(tmp_path)
    shape = options.shape
    seen: list[str] = []
    dec = decentralized(manifest, shape, tmp_path, seen.append)
    cen = centralized(manifest, shape, tmp_path)
    assert len(dec.rows) == len(cen.rows) == 2 and len(seen) == 2
    assert all(r.hashes_agree for r in dec.rows)  # every worker and miner applied the patch to the same state
    assert dec.rejected_batches == 0
    assert dec.reward_start == cen.reward_start  # both start from the same warm start
    assert all(r.patch_bytes > 0 and r.dense_bytes > 0 and 0 <= r.density <= 1 for r in dec.rows)
    assert any(r.aggregated > 0 for r in dec.rows) and any(r.density > 0 for r in cen.rows)
    result = bench.result(manifest, shape, dec, cen)
    assert set(KEYS) <= set(result.summary)
    assert result.summary["hashes_agree"] is True
    assert result.summary["sync_ratio_vs_dense"] == pytest.approx(
        sum(r.patch_bytes for r in dec.rows) / sum(r.dense_bytes for r in dec.rows)
    )
    assert set(result.summary["targets"]) == {"reward_rises", "within_5pct_of_centralized", "density_at_most_2pct"}


def test_pool_refuses_lying_workers(cache: Path) -> None:
    tmp_path = cache
    manifest, _ = _tiny(tmp_path)
    w0 = warm_start(manifest.model.gpt, manifest.model.seed, manifest.rl, tmp_path)
    model = build_gpt(manifest.model.gpt)
    weights = {n: t.to(torch.bfloat16) for n, t in w0.items()}
    h = state_hash(weights)
    honest, liar, stale = (_Holder(identity_for(f"t/{i}"), weights, h) for i in range(3))
    published = [(w.key, *publish_batch(manifest, model, w, 0)) for w in (honest, liar, stale)]

    def told(worker: str, batch: RolloutBatch) -> tuple[str, RolloutAnnouncement, bytes]:
        data = rollouts.encode(batch)  # announced truthfully: the lie is inside the batch
        return worker, announce(batch, data), data

    lie = rollouts.decode(published[1][2])
    g = lie.groups[0]
    flipped = tuple(1.0 - r if r in (0.0, 1.0) else 0.0 for r in g.rewards)
    published[1] = told(liar.key, replace(lie, groups=(replace(g, rewards=flipped), *lie.groups[1:])))
    published[2] = told(stale.key, replace(rollouts.decode(published[2][2]), state_hash="00" * 32))
    good, rejected = checked_pool(manifest, published, 0, h)
    assert rejected == 2 and [b.worker for b in good] == [honest.key]
    assert state_hash(bf16_state(model)) == h  # the worker's model held W_0's BF16 weights
