"""An RL run in one process with the real pieces, and the single-process GRPO run it is compared with.

Decentralized (`decentralized`), every round r:

    workers    hold BF16 W_r (PULSESync), sample G completions for their prompts of
               (run id, r, worker key), score them, publish `protocol.rollouts` bytes
    validator  vets each batch with the real validator's rule (`node/learn/rl/checks.py`: bounded
               decode, state hash, prompts, claimed rewards), orders the pool by worker key: the
               round's `PoolSource`
    miners     hold BF16 W_r and run the real miner's step (`node/run/trainer.py` `RLTrainer`): H GRPO
               steps on the pool samples their assignment seeds name, W_r - W_local compressed with
               the run's PULSELoCo codec and error feedback; then sign
    validator  `validator.core.Validator.run_round`: Gauntlet scoring with `GRPOEvaluator` on the
               pool, selection, aggregation, outer step, PULSESync patch W_r -> W_{r+1}
    everyone   applies the patch (`pulsesync.apply`) and checks the state hash it announced

Centralized (`centralized`): one model, FP32 weights, the same prompts and rollouts per round
(W workers' worth, sampled from the current policy) and the same optimizer steps (R x H AdamW
steps per round, `groups_per_batch` groups per step as a miner's, cycling), no codec and no outer step.

Both measure the held-out reward (greedy) on the BF16 weights a node would serve, every round.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from node.events import steps
from node.learn.model import GPT, build_gpt
from node.learn.rl.checks import announce, vet
from node.learn.rl.evaluator import GRPOEvaluator, PoolSource, held_out_reward
from node.learn.rl.generate import rollout_groups, rollout_seed
from node.learn.rl.grpo import GRPOTrainer
from node.learn.rl.task import held_out_prompts, problems_for
from node.learn.rl.warmstart import warm_start
from node.learn.train import bf16_state, changed_fraction, load_bf16_state, load_state
from node.run.manifest import Manifest
from node.run.trainer import MinerSpec, RLTrainer
from protocol import pulsesync, rollouts
from protocol.identity import Identity
from protocol.messages import RolloutAnnouncement
from protocol.rollouts import RolloutBatch, RolloutGroup
from protocol.signing import sign
from protocol.state import State
from protocol.statehash import state_hash
from validator.core import Validator
from validator.intake import Submission

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


def identity_for(label: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(f"pulse-bench-rl/{label}".encode()).digest())


@dataclass(frozen=True)
class Shape:
    """How many of each role, and how long."""

    workers: int
    miners: int
    rounds: int


@dataclass
class RoundRow:
    round: int
    reward: float  # held-out reward (greedy) after the round
    rollout_reward: float  # mean reward of the round's rollouts (sampled at the run's temperature)
    aggregated: int
    patch_bytes: int
    dense_bytes: int  # BF16 weights, whole
    density: float  # fraction of BF16 weights the patch changed
    payload_bytes: float  # mean miner payload
    payload_density: float  # mean fraction of entries a miner sent
    hashes_agree: bool  # every worker and miner reached the validator's announced state


@dataclass
class RunRecord:
    reward_start: float
    rows: list[RoundRow] = field(default_factory=list)
    seconds: float = 0.0
    validator_seconds: float = 0.0
    rejected_batches: int = 0
    step_density: float | None = None  # centralized: mean fraction of BF16 weights one optimizer step changes


@dataclass
class _Holder:
    """A worker or miner: its key and the BF16 global weights it holds."""

    identity: Identity
    weights: State
    state_hash: str
    trainer: RLTrainer | None = None

    @property
    def key(self) -> str:
        return self.identity.public_hex


def _policy(manifest: Manifest, weights: State) -> GPT:
    model = build_gpt(manifest.model.gpt)
    load_state(model, weights)
    return model


def _note(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)


def publish_batch(manifest: Manifest, model: GPT, worker: _Holder, round_: int) -> tuple[RolloutAnnouncement, bytes]:
    """A worker's rollout batch for `round_`: what it announces, and the bytes it publishes."""
    cfg = manifest.rl
    load_bf16_state(model, worker.weights)
    prompts = problems_for(manifest.run_id, round_, worker.key, cfg.prompts_per_batch, cfg)
    groups = rollout_groups(model, prompts, cfg, rollout_seed(manifest.run_id, round_, worker.key))
    batch = RolloutBatch(manifest.run_id, round_, worker.key, worker.state_hash, tuple(groups))
    data = rollouts.encode(batch)
    return announce(batch, data), data


def checked_pool(
    manifest: Manifest, published: list[tuple[str, RolloutAnnouncement, bytes]], round_: int, state: str
) -> tuple[list[RolloutBatch], int]:
    """Vet each (worker key, announcement, bytes) as the validator does: (usable batches by worker key, refused)."""
    good, rejected = [], 0
    for worker, announced, data in published:
        found = vet(data, announced, worker, manifest.run_id, {round_: state}, manifest.rl)
        if isinstance(found, str):
            log.warning("round %d: rollout batch of %s refused: %s", round_, worker[:12], found)
            rejected += 1
            continue
        good.append(found)
    return sorted(good, key=lambda b: b.worker), rejected


def _submit(manifest: Manifest, miner: _Holder, batches: list[RolloutBatch], round_: int) -> tuple[Submission, float]:
    """The real miner's step on the round's pool, signed; (submission, fraction of entries sent)."""
    trainer = miner.trainer
    assert trainer is not None
    trainer.use_pool(round_, [b.groups for b in batches])
    delta = trainer.train(round_, miner.weights)
    header, payload = trainer.package(round_, delta, miner.weights, miner.state_hash)
    assert trainer.last_stats is not None
    return Submission(sign(miner.identity, header).to_bytes(), payload), trainer.last_stats.density


def _miner(manifest: Manifest, i: int, weights: State, state: str, reference: State | None) -> _Holder:
    """Miner i: BF16 weights, and the miner's trainer, whose AdamW state persists across rounds."""
    identity = identity_for(f"miner/{i}")
    spec = MinerSpec.from_manifest(manifest)
    trainer = RLTrainer(spec, build_gpt(manifest.model.gpt), identity, manifest.rl, reference)
    return _Holder(identity, weights, state, trainer)


def _sync(holders: list[_Holder], patch: bytes, announced: str) -> bool:
    """Every holder applies the round's PULSESync patch; True when all reach the announced state hash."""
    agree = True
    for holder in holders:
        holder.weights = pulsesync.apply(holder.weights, patch)  # checks the old and new hashes it names
        holder.state_hash = state_hash(holder.weights)
        agree &= holder.state_hash == announced
    return agree


def decentralized(
    manifest: Manifest, shape: Shape, cache_dir: Path | None = None, progress: Progress | None = None
) -> RunRecord:
    """The decentralized run (module docstring); every holder's state hash is checked every round."""
    cfg, gpt = manifest.rl, manifest.model.gpt
    w0 = warm_start(gpt, manifest.model.seed, cfg, cache_dir)
    reference = w0 if cfg.kl_coef > 0 else None
    held = held_out_prompts(cfg)
    probe = _policy(manifest, w0)
    pool = PoolSource(gpt.block_size, groups_per_seed=cfg.groups_per_batch)
    evaluator = GRPOEvaluator(build_gpt(gpt), cfg, reference)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pulse-bench-rl-") as folder:
        v = Validator.create(
            Path(folder), manifest.gauntlet(), manifest.run_id, identity_for("validator"), w0, evaluator, pool
        )
        load_bf16_state(probe, v.weights)
        record = RunRecord(reward_start=held_out_reward(probe, held, cfg))
        workers = [_Holder(identity_for(f"worker/{i}"), v.weights, v.state_hash) for i in range(shape.workers)]
        miners = [_miner(manifest, i, v.weights, v.state_hash, reference) for i in range(shape.miners)]
        worker_model = build_gpt(gpt)
        for r in steps(range(shape.rounds), "decentralized rounds"):
            published = [(w.key, *publish_batch(manifest, worker_model, w, r)) for w in workers]
            batches, rejected = checked_pool(manifest, published, r, v.state_hash)
            record.rejected_batches += rejected
            made: list[tuple[Submission, float]] = []
            if batches:  # no usable rollouts: the round closes with no submissions and an empty patch
                pool.set([b.groups for b in batches])
                made = [_submit(manifest, m, batches, r) for m in miners]
            old = v.weights  # W_r: run_round replaces, never mutates, the validator's weights
            report = v.run_round([s for s, _ in made])
            record.validator_seconds += report.seconds
            agree = _sync([*workers, *miners], report.patch, report.state_hash) and v.state_hash == report.state_hash
            load_bf16_state(probe, v.weights)
            row = RoundRow(
                round=r,
                reward=held_out_reward(probe, held, cfg),
                rollout_reward=sum(b.mean_reward for b in batches) / max(len(batches), 1),
                aggregated=len(report.selected()),
                patch_bytes=len(report.patch),
                dense_bytes=sum(2 * t.numel() for t in v.weights.values()),
                density=changed_fraction(old, v.weights),
                payload_bytes=sum(len(s.read()) for s, _ in made) / max(len(made), 1),
                payload_density=sum(d for _, d in made) / max(len(made), 1),
                hashes_agree=agree,
            )
            record.rows.append(row)
            _note(progress, _describe("decentralized", row, shape.rounds))
    record.seconds = time.perf_counter() - start
    return record


def centralized(
    manifest: Manifest, shape: Shape, cache_dir: Path | None = None, progress: Progress | None = None
) -> RunRecord:
    """Single-process GRPO with the decentralized run's rollouts per round and optimizer steps (module docstring)."""
    cfg, gpt = manifest.rl, manifest.model.gpt
    w0 = warm_start(gpt, manifest.model.seed, cfg, cache_dir)
    model = _policy(manifest, w0)
    trainer = GRPOTrainer(
        model,
        manifest.train.inner,
        cfg,
        reference=w0 if cfg.kl_coef > 0 else None,
        minibatch_groups=cfg.groups_per_batch,
    )
    held = held_out_prompts(cfg)
    probe = _policy(manifest, w0)
    keys = [identity_for(f"worker/{i}").public_hex for i in range(shape.workers)]
    load_bf16_state(probe, bf16_state(model))
    record = RunRecord(reward_start=held_out_reward(probe, held, cfg))
    steps_seen = _StepDensity(model)
    start = time.perf_counter()
    for r in steps(range(shape.rounds), "single-process rounds"):
        groups: list[RolloutGroup] = []
        for key in keys:
            prompts = problems_for(manifest.run_id, r, key, cfg.prompts_per_batch, cfg)
            groups += rollout_groups(model, prompts, cfg, rollout_seed(manifest.run_id, r, key))
        before = bf16_state(model)
        trainer.steps(groups, shape.miners * manifest.train.inner_steps, steps_seen)
        after = steps_seen.last
        load_bf16_state(probe, after)
        row = RoundRow(
            round=r,
            reward=held_out_reward(probe, held, cfg),
            rollout_reward=sum(sum(g.rewards) for g in groups) / sum(len(g.rewards) for g in groups),
            aggregated=0,
            patch_bytes=0,
            dense_bytes=sum(2 * t.numel() for t in after.values()),
            density=changed_fraction(before, after),
            payload_bytes=0.0,
            payload_density=0.0,
            hashes_agree=True,
        )
        record.rows.append(row)
        _note(progress, _describe("centralized", row, shape.rounds))
    record.seconds = time.perf_counter() - start
    record.step_density = sum(steps_seen.fractions) / len(steps_seen.fractions)
    return record


class _StepDensity:
    """After each optimizer step: the fraction of BF16 weights that step changed."""

    def __init__(self, model: GPT) -> None:
        self.model, self.last = model, bf16_state(model)
        self.fractions: list[float] = []

    def __call__(self, _: int) -> None:
        now = bf16_state(self.model)
        self.fractions.append(changed_fraction(self.last, now))
        self.last = now


def _describe(name: str, row: RoundRow, rounds: int) -> str:
    return (
        f"{name} round {row.round + 1}/{rounds}: held-out reward {row.reward:.3f}, rollouts {row.rollout_reward:.3f}, "
        f"{row.aggregated} aggregated, patch {row.patch_bytes:,} B ({100 * row.density:.2f}% changed)"
    )
