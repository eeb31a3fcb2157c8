"""GRPO: advantages, the clipped loss, the trainer, and the policy as the validator's evaluator."""

from __future__ import annotations

import math

import pytest
import torch

from node.learn.model import GPTConfig, build_gpt
from node.learn.rl.config import RLConfig
from node.learn.rl.evaluator import GRPOEvaluator, PoolSource, held_out_reward, pool_batch_fn
from node.learn.rl.grpo import (
    GRPOTrainer,
    group_advantages,
    grpo_loss,
    kl_k3,
    rollout_tensors,
    surrogate,
    token_logps,
)
from node.learn.rl.task import answer, reward
from node.learn.train import InnerOptimConfig, bf16_state
from protocol.rollouts import RolloutGroup
from validator.scoring import RoundEvaluation

CFG = RLConfig(digits=2, group_size=4, max_new_tokens=4, clip_eps=0.2)
GPT = GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32)


def _group(prompt: bytes, completions: tuple[bytes, ...]) -> RolloutGroup:
    return RolloutGroup(prompt, completions, tuple(reward(prompt, c) for c in completions))


def _groups() -> list[RolloutGroup]:
    """Groups with mixed rewards (1, 0.1, 0) so every group carries a learning signal."""
    out = []
    for a, b in [(12, 30), (7, 5), (45, 44), (9, 91)]:
        p = b"%d+%d=" % (a, b)
        right = answer(p)
        out.append(_group(p, (right, b"1\n", b"x+", right)))
    return out


def test_advantages_are_zero_mean_per_group_and_zero_for_ties() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.1, 1.0], [0.1, 0.1, 0.1, 0.1], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    adv = group_advantages(rewards)
    assert torch.allclose(adv.mean(dim=1), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    assert torch.equal(adv[1], torch.zeros(4, dtype=torch.float64))
    assert adv[2, 3] > 0 and (adv[2, :3] < 0).all()
    assert math.isclose(float(adv[2].std(correction=0)), 1.0, rel_tol=1e-3)


def test_tensors_mask_exactly_the_completion_bytes() -> None:
    g = _group(b"1+2=", (b"3\n", b"4\n", b"", b"33\n"))
    t = rollout_tensors([g])
    assert t.tokens.shape == (4, 7) and t.mask.shape == (4, 6)
    assert bytes(t.tokens[3].tolist()) == b"1+2=33\n"
    # logits at position 3 ('=') predict the first completion byte
    assert t.mask[3].tolist() == [0, 0, 0, 1, 1, 1]
    assert t.mask[0].tolist() == [0, 0, 0, 1, 1, 0]
    assert t.mask[2].sum() == 0  # an empty completion has no tokens (and weighs 0 in J)
    assert t.rewards.tolist() == [1.0, pytest.approx(0.1), 0.0, pytest.approx(0.1)]
    with pytest.raises(ValueError, match="block_size"):
        rollout_tensors([g], block_size=6)
    with pytest.raises(ValueError, match="different sizes"):
        rollout_tensors([g, _group(b"1+2=", (b"3\n",))])


def test_surrogate_is_mean_advantage_at_ratio_one_and_clips() -> None:
    t = rollout_tensors(_groups())
    logp = torch.randn(t.mask.shape)
    assert abs(float(surrogate(logp, logp, t.advantages, t.mask, 0.2))) < 1e-6  # = mean(A) = 0
    doubled = logp + math.log(2.0)  # ratio 2 on every token
    per_row = torch.where(t.advantages > 0, 1.2 * t.advantages, 2.0 * t.advantages)
    has_tokens = t.mask.sum(dim=1) > 0
    expected = (per_row * has_tokens).mean()
    assert float(surrogate(doubled, logp, t.advantages, t.mask, 0.2)) == pytest.approx(float(expected), rel=1e-5)
    assert float(kl_k3(logp, logp, t.mask)) == 0.0
    assert float(kl_k3(logp, logp + 0.3, t.mask)) > 0


def test_one_gradient_step_favours_rewarded_completions() -> None:
    torch.manual_seed(0)
    model = build_gpt(GPT, seed=1)
    t = rollout_tensors(_groups())
    old = token_logps(model, t.tokens).detach()
    loss = grpo_loss(token_logps(model, t.tokens), old, t.advantages, t.mask, 0.2)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(p.grad, alpha=0.05)
        new = token_logps(model, t.tokens)
    gained = ((new - old) * t.mask).sum(dim=1)  # change of each completion's log-likelihood
    assert (gained[t.advantages > 0] > 0).all()
    assert (gained[t.advantages < 0] < 0).all()


def _trained(steps: int = 4) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[RolloutGroup]]:
    model = build_gpt(GPT, seed=2)
    weights = bf16_state(model)
    trainer = GRPOTrainer(model, InnerOptimConfig(lr=1e-3, weight_decay=0.0), CFG, minibatch_groups=2)
    groups = _groups()
    delta = trainer.train(weights, groups, steps)
    assert math.isfinite(trainer.last_loss) and trainer.steps_done == steps
    assert trainer.last_reward == pytest.approx(float(rollout_tensors(groups).rewards.mean()))
    return weights, delta, groups


def test_trainer_refuses_nothing_to_train_on() -> None:
    trainer = GRPOTrainer(build_gpt(GPT), InnerOptimConfig(lr=1e-3), CFG)
    with pytest.raises(ValueError, match="no rollout groups"):
        trainer.steps([], 1)
    with pytest.raises(ValueError, match="steps"):
        trainer.steps(_groups(), 0)


def test_trainer_is_deterministic_and_returns_w_minus_local() -> None:
    w1, d1, _ = _trained()
    _, d2, _ = _trained()
    assert all(torch.equal(d1[n], d2[n]) for n in d1)
    assert set(d1) == set(w1) and all(d.dtype == torch.float32 for d in d1.values())
    assert sum(float(d.abs().sum()) for d in d1.values()) > 0


def test_evaluator_gain_sign_and_no_stale_cache() -> None:
    weights, delta, groups = _trained()
    evaluator = GRPOEvaluator(build_gpt(GPT, seed=9), CFG)
    batch = pool_batch_fn([groups])(12345)
    evaluator.load(weights)
    assert evaluator.loss(batch) == pytest.approx(1.0, abs=1e-6)  # J = mean(A) = 0 at the base
    flipped = {n: -d for n, d in delta.items()}
    ev = RoundEvaluation(evaluator, weights, 1.0, [batch], {0: [batch], 1: [batch]})
    assert ev.gains(0, delta, 1.0, None).assigned > 0  # the trained update improves J on its batch
    assert ev.gains(1, flipped, 1.0, None, complete=True).assigned < 0  # its opposite makes J worse
    # a new base: logp_old must be recomputed there, so the loss at the new base is 1 again
    moved = {n: (w.float() - d).to(torch.bfloat16) for (n, w), d in zip(weights.items(), delta.values(), strict=True)}
    evaluator.load(moved)
    assert evaluator.loss(batch) == pytest.approx(1.0, abs=1e-6)
    # a batch first seen while an update is loaded still takes logp_old at the base
    fresh = rollout_tensors(groups)
    evaluator.load(weights)
    evaluator.load(weights, delta, 1.0)
    late = evaluator.loss(fresh)
    assert late == pytest.approx(evaluator.loss(batch), abs=1e-7) and late < 1.0


def test_pool_source_samples_groups_by_seed() -> None:
    groups = _groups()
    pool = PoolSource(GPT.block_size)
    with pytest.raises(RuntimeError):
        pool(0)
    pool.set([groups[:2], groups[2:]])
    assert pool(4) is pool(4)  # built once per seed and round: the evaluator's cache relies on it
    assert len(pool.groups([4])) == 2  # one worker batch's worth, from the whole pool
    samples = {tuple(pool.sample(seed)) for seed in range(40)}
    assert len(samples) > 3  # seeds name different samples, not just the two pool batches
    both = pool.groups([4, 5])
    assert len(both) == len(set(map(id, both))) and set(map(id, pool.groups([4]))) <= set(map(id, both))
    assert pool.batches_for([4, 5]) == sorted({b for s in (4, 5) for b, _ in pool.sample(s)})
    pool.set([groups])
    assert len(pool(4).advantages) == 4 * CFG.group_size  # a new pool (one batch of 4): nothing cached


def test_held_out_reward_is_the_greedy_mean() -> None:
    model = build_gpt(GPT, seed=0)
    prompts = [g.prompt for g in _groups()]
    r = held_out_reward(model, prompts, CFG)
    assert 0.0 <= r <= 1.0
