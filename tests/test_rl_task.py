"""The RL task (prompts, rewards, checks), the rollout batch wire format, and sampling."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from node.learn.model import GPTConfig, build_gpt
from node.learn.rl.config import RLConfig
from node.learn.rl.generate import greedy, rollout_groups, rollout_seed
from node.learn.rl.task import (
    FORMAT_REWARD,
    answer,
    held_out_prompts,
    problems_for,
    reward,
    sft_examples,
    verify_group,
    verify_groups,
)
from protocol import rollouts
from protocol.errors import (
    NonFiniteValues,
    SizeLimitExceeded,
    TrailingBytes,
    TruncatedPayload,
    UnknownVersion,
)
from protocol.rollouts import RolloutBatch, RolloutGroup, RolloutLimits

RUN = "ab" * 32
WORKER = "cd" * 32
CFG = RLConfig(digits=2, group_size=4, prompts_per_batch=3, max_new_tokens=4)


def test_problems_are_derived_not_chosen() -> None:
    a = problems_for(RUN, 3, WORKER, 8, CFG)
    assert a == problems_for(RUN, 3, WORKER, 8, CFG)
    assert a[:5] == problems_for(RUN, 3, WORKER, 5, CFG)  # index i names the same problem whatever the count
    assert a != problems_for(RUN, 4, WORKER, 8, CFG)
    assert a != problems_for(RUN, 3, "ce" * 32, 8, CFG)
    assert a != problems_for("ac" * 32, 3, WORKER, 8, CFG)
    for p in a:
        x, y = p[:-1].split(b"+")
        assert 0 <= int(x) < 100 and 0 <= int(y) < 100 and p.endswith(b"=")


def test_held_out_set_is_fixed_and_its_own() -> None:
    cfg = CFG.model_copy(update={"held_out_prompts": 64})
    held = held_out_prompts(cfg)
    assert held == held_out_prompts(cfg) and len(held) == 64
    assert held != problems_for(RUN, 0, WORKER, 64, cfg)
    assert len({answer(p) for p in held}) > 20  # varied problems
    examples = sft_examples(7, 0, 16, cfg)
    assert all(reward(p, a) == 1.0 for p, a in examples)
    assert examples != sft_examples(7, 1, 16, cfg)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (b"85\n", 1.0),
        (b"86\n", FORMAT_REWARD),
        (b"085\n", FORMAT_REWARD),  # not the canonical decimal
        (b"85", 0.0),  # no terminator: ran out of budget
        (b"85\n\n", 0.0),
        (b"8 5\n", 0.0),
        (b"\n", 0.0),
        (b"", 0.0),
        (b"-85\n", 0.0),
    ],
)
def test_reward_cases(completion: bytes, expected: float) -> None:
    assert reward(b"37+48=", completion) == expected


@pytest.mark.parametrize("prompt", [b"37+48", b"37-48=", b"a+1=", b"1234567+1=", b"", b"37+48=\n"])
def test_non_task_prompt_is_a_value_error(prompt: bytes) -> None:
    with pytest.raises(ValueError, match="not a task prompt"):
        reward(prompt, b"85\n")


def _group(
    prompt: bytes = b"37+48=", completions: tuple[bytes, ...] = (b"85\n", b"86\n", b"x", b"85\n")
) -> RolloutGroup:
    return RolloutGroup(prompt, completions, tuple(reward(prompt, c) for c in completions))


def test_verify_group_catches_lies() -> None:
    good = _group()
    assert verify_group(good, CFG) is None
    lie = RolloutGroup(good.prompt, good.completions, (1.0, 1.0, 1.0, 1.0))
    assert "claimed reward" in (verify_group(lie, CFG) or "")
    assert "not a task prompt" in (verify_group(_group().__class__(b"hi", good.completions, good.rewards), CFG) or "")
    assert "group of 3" in (verify_group(_group(completions=(b"85\n",) * 3), CFG) or "")
    assert "longer" in (verify_group(_group(completions=(b"85\n",) * 3 + (b"12345\n",)), CFG) or "")
    prompts = problems_for(RUN, 0, WORKER, 2, CFG)
    groups = [_group(p, (answer(p),) * 4) for p in prompts]
    assert verify_groups(groups, prompts, CFG) is None
    assert verify_groups(groups[::-1], prompts, CFG) == "the prompts are not the worker's assigned problems"


# -- the rollout batch wire format ----------------------------------------------------------


def _batch() -> RolloutBatch:
    return RolloutBatch(RUN, 5, WORKER, "ef" * 32, (_group(), _group(b"1+2=", (b"3\n", b"4\n", b"", b"3\n"))))


def test_rollout_batch_round_trip_keeps_float32_rewards() -> None:
    batch = _batch()
    back = rollouts.decode(rollouts.encode(batch))
    assert (back.run_id, back.round, back.worker, back.state_hash) == (RUN, 5, WORKER, "ef" * 32)
    assert [g.completions for g in back.groups] == [g.completions for g in batch.groups]
    assert back.groups[0].rewards[1] == struct.unpack("<f", struct.pack("<f", FORMAT_REWARD))[0]
    assert all(verify_group(g, CFG) is None for g in back.groups)  # float32 rounding is tolerated


def test_rollout_batch_hostile_bytes() -> None:
    data = rollouts.encode(_batch())
    with pytest.raises(TruncatedPayload):
        rollouts.decode(data[:-3])
    with pytest.raises(TrailingBytes):
        rollouts.decode(data + b"\x00")
    with pytest.raises(UnknownVersion):
        rollouts.decode(b"XXXX" + data[4:])
    with pytest.raises(SizeLimitExceeded):
        rollouts.decode(data, RolloutLimits(max_batch_bytes=len(data) - 1))
    with pytest.raises(SizeLimitExceeded):
        rollouts.decode(data, RolloutLimits(max_group_size=3))
    with pytest.raises(SizeLimitExceeded):
        rollouts.decode(data, RolloutLimits(max_groups=1))
    # a header that announces 2**40 groups is refused before anything is allocated
    head = data[: 4 + 32 + 1 + 32 + 32]
    huge = head + bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x20])
    with pytest.raises(SizeLimitExceeded):
        rollouts.decode(huge)
    nan = RolloutBatch(RUN, 5, WORKER, "ef" * 32, (RolloutGroup(b"1+2=", (b"3\n",), (math.nan,)),))
    with pytest.raises(NonFiniteValues):
        rollouts.decode(rollouts.encode(nan))


# -- sampling -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model() -> torch.nn.Module:
    return build_gpt(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32), seed=3)


def test_rollouts_are_deterministic_per_seed(tiny_model: torch.nn.Module) -> None:
    prompts = problems_for(RUN, 0, WORKER, 3, CFG)
    seed = rollout_seed(RUN, 0, WORKER)
    a = rollout_groups(tiny_model, prompts, CFG, seed)
    assert a == rollout_groups(tiny_model, prompts, CFG, seed)
    assert a != rollout_groups(tiny_model, prompts, CFG, seed + 1)
    assert [g.prompt for g in a] == prompts
    for g in a:
        assert len(g.completions) == CFG.group_size
        assert all(len(c) <= CFG.max_new_tokens for c in g.completions)
        assert all(b"\n" not in c[:-1] for c in g.completions)  # stops at the terminator
        assert g.rewards == tuple(reward(g.prompt, c) for c in g.completions)


def test_greedy_matches_argmax_and_respects_block_size(tiny_model: torch.nn.Module) -> None:
    prompts = [b"1+2=", b"37+48="]  # different lengths share one right-padded buffer
    out = greedy(tiny_model, prompts, 3)
    for p, c in zip(prompts, out, strict=True):
        alone = greedy(tiny_model, [p], 3)[0]
        assert c == alone
        seq = list(p)
        for byte in c:  # every byte is the argmax given the prefix
            logits = tiny_model(torch.tensor([seq]))[0, -1]
            assert int(logits.argmax()) == byte
            seq.append(byte)
    with pytest.raises(ValueError, match="block_size"):
        greedy(tiny_model, [b"37+48="], 11)
