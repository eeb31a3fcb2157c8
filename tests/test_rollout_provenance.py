"""Rollouts must be sampled from the round's weights: honest batches pass, fabricated ones are refused.

A small byte-level GPT after a short supervised warm start (300 steps: it answers in the task's
format and often right) is the policy W_r. Honest batches are sampled from it the way a worker
samples them; fabricated ones pass every public check (the derived prompts, G completions each,
truthful rewards, the right state hash) but were chosen, not sampled. The pool refuses them with a
reason and leaves their worker out, even when the fabricating key was ground to sort first. (Half
as much warm start and wrong sums are what the policy itself writes: then they pass, rightly.)
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
import torch

from node.events import Events
from node.learn.model import CausalLM, GPTConfig, build_gpt
from node.learn.rl.config import RLConfig
from node.learn.rl.generate import rollout_groups, rollout_seed
from node.learn.rl.provenance import Z_HIGH, Z_LOW, SamplingCheck, judge, sampling_z
from node.learn.rl.task import answer, problems_for, reward
from node.learn.rl.warmstart import warm_start
from node.learn.train import load_bf16_state
from node.roles.rl.pool import PENALTY_ROUNDS, PoolKeeper
from protocol.identity import Identity
from protocol.rollouts import RolloutBatch, RolloutGroup
from protocol.state import State
from protocol.statehash import state_hash
from tests.rollouts import RUN, Workers

CFG = RLConfig(
    warm_start_steps=300, prompts_per_batch=4, group_size=4, max_staleness=1, pool_wait_seconds=0.2, pool_batches=4
)
GPT = GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[CausalLM, State]:
    torch.set_num_threads(1)
    master = warm_start(GPT, 0, CFG, cache_dir=tmp_path_factory.mktemp("warm-start"))
    weights = {n: t.to(torch.bfloat16) for n, t in master.items()}
    model = build_gpt(GPT)
    load_bf16_state(model, weights)
    return model, weights


def sampled(model: CausalLM, worker: str, round_: int, weights: State) -> RolloutBatch:
    prompts = problems_for(RUN, round_, worker, CFG.prompts_per_batch, CFG)
    groups = rollout_groups(model, prompts, CFG, rollout_seed(RUN, round_, worker))
    return RolloutBatch(RUN, round_, worker, state_hash(weights), tuple(groups))


def fabricated(worker: str, round_: int, weights: State, completion: object) -> RolloutBatch:
    """Every public fact right; the completions chosen by `completion(prompt, j)`."""
    assert callable(completion)
    groups = []
    for prompt in problems_for(RUN, round_, worker, CFG.prompts_per_batch, CFG):
        chosen = tuple(completion(prompt, j) for j in range(CFG.group_size))
        groups.append(RolloutGroup(prompt, chosen, tuple(reward(prompt, c) for c in chosen)))
    return RolloutBatch(RUN, round_, worker, state_hash(weights), tuple(groups))


def wrong(prompt: bytes, j: int) -> bytes:
    """A wrong sum in the task's format: what a poisoner would have miners prefer over garbage."""
    return str((int(answer(prompt)) + 37 + 11 * j) % 200).encode() + b"\n"


FABRICATIONS = {
    "garbage": lambda prompt, j: b"x" * (j + 1) + b"\n",
    "one wrong answer everywhere": lambda prompt, j: b"7\n",
    "wrong sums, and one correct": lambda prompt, j: answer(prompt) if j == 0 else wrong(prompt, j),
}


def test_honest_batches_look_sampled(policy: tuple[CausalLM, State]) -> None:
    model, weights = policy
    zs = [sampling_z(model, sampled(model, f"{i:064x}", 3, weights).groups, CFG.temperature) for i in range(30)]
    assert all(Z_LOW <= z <= Z_HIGH for z in zs), zs
    assert abs(sum(zs) / len(zs)) < 1.0  # centred, as the statistic should be


@pytest.mark.parametrize("name", list(FABRICATIONS))
def test_fabricated_completions_are_refused(policy: tuple[CausalLM, State], name: str) -> None:
    model, weights = policy
    batch = fabricated("ab" * 32, 3, weights, FABRICATIONS[name])
    problem = judge(sampling_z(model, batch.groups, CFG.temperature))
    assert problem is not None and "not sampled from the round's weights" in problem


def test_the_pool_refuses_fabricated_rollouts_from_a_key_ground_to_sort_first(
    policy: tuple[CausalLM, State], tmp_path: Path
) -> None:
    model, weights = policy
    honest = [Identity.from_seed(hashlib.sha256(f"honest/{i}".encode()).digest()) for i in range(2)]
    seeds = (hashlib.sha256(f"grind/{i}".encode()).digest() for i in range(10_000))
    first = min(h.public_hex for h in honest)
    fabricator = next(k for s in seeds if (k := Identity.from_seed(s)).public_hex < first)  # sorts first by key
    net = Workers(tmp_path)
    check = SamplingCheck(build_gpt(GPT), CFG)
    check.remember(3, weights)
    keeper = PoolKeeper(net.validator, CFG, RUN, Events("validator"), sampling=check)

    async def main() -> None:
        for worker in honest:
            await net.publish(worker, sampled(model, worker.public_hex, 3, weights))
        await net.publish(
            fabricator, fabricated(fabricator.public_hex, 3, weights, FABRICATIONS["wrong sums, and one correct"])
        )
        pool, _ = await keeper.build(3, {3: state_hash(weights)})
        assert {e.worker for e in pool.entries} == {h.public_hex for h in honest}
        refused = {r.worker: r.reason for r in pool.rejections}
        assert "not sampled from the round's weights" in refused[fabricator.public_hex]
        assert keeper.penalized[fabricator.public_hex] == 3 + PENALTY_ROUNDS

    asyncio.run(main())
