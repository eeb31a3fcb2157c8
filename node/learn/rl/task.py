"""The verifiable task of an RL run: addition of decimal numbers, in bytes, with a checkable reward.

    prompt      b"37+48="           operands uniform in [0, 10**digits)
    answer      b"85\\n"             the sum in decimal, then the terminator
    reward      1.0                 the completion is exactly the answer (terminator included)
                FORMAT_REWARD       digits then the terminator, but the wrong number
                0.0                 anything else (no terminator within the budget, stray bytes)

Prompts are derived by hashing, never chosen: a worker's training prompts for a round come from
(run id, round, worker key, index) under one domain string, the validator's held-out prompts from
an index under another. Anyone can recompute both, so nobody can pick easy problems, and a
batch whose prompts are not its worker's is caught by comparing with `problems_for`.

The reward is a pure function of (prompt, completion): whoever uses a rollout recomputes it.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence

from node.learn.rl.config import RLConfig
from protocol.rollouts import RolloutGroup

TERMINATOR = b"\n"
FORMAT_REWARD = 0.1
TRAIN_DOMAIN = b"pulse/rl-task/train/v1\x00"
HELD_OUT_DOMAIN = b"pulse/rl-task/held-out/v1\x00"
SFT_DOMAIN = b"pulse/rl-task/sft/v1\x00"
REWARD_TOLERANCE = 1e-6  # claimed rewards travel as float32: 0.1 comes back as 0.100000001...

_PROMPT = re.compile(rb"([0-9]{1,6})\+([0-9]{1,6})=")
_NUMBER_LINE = re.compile(rb"[0-9]{1,16}\n")


def _operands(digest: bytes, digits: int) -> tuple[int, int]:
    """Two operands in [0, 10**digits) from 16 bytes of a hash (bias < 2**-40: 64-bit draws)."""
    hi, lo = struct.unpack(">QQ", digest[:16])
    return hi % 10**digits, lo % 10**digits


def make_prompt(a: int, b: int) -> bytes:
    return b"%d+%d=" % (a, b)


def answer(prompt: bytes) -> bytes:
    """The exact completion that earns reward 1.0; `ValueError` for a prompt that is not a task prompt."""
    match = _PROMPT.fullmatch(prompt)
    if match is None:
        raise ValueError(f"not a task prompt: {prompt[:32]!r}")
    return b"%d" % (int(match[1]) + int(match[2])) + TERMINATOR


def reward(prompt: bytes, completion: bytes) -> float:
    """Deterministic reward of `completion` for `prompt` (see the module docstring).

    Raises `ValueError` when `prompt` is not a task prompt: such a rollout cannot be scored, and
    whoever holds it (the validator, a miner) should drop its batch rather than score it as 0.
    """
    expected = answer(prompt)
    if completion == expected:
        return 1.0
    return FORMAT_REWARD if _NUMBER_LINE.fullmatch(completion) else 0.0


def problems_for(run_id: str, round_: int, worker: str, count: int, cfg: RLConfig) -> list[bytes]:
    """The `count` prompts `worker` (64-hex key) answers in `round_` of `run_id`."""
    prefix = TRAIN_DOMAIN + bytes.fromhex(run_id) + struct.pack(">Q", round_) + bytes.fromhex(worker)
    return [
        make_prompt(*_operands(hashlib.sha256(prefix + struct.pack(">I", i)).digest(), cfg.digits))
        for i in range(count)
    ]


def held_out_prompts(cfg: RLConfig) -> list[bytes]:
    """The fixed held-out set (`cfg.held_out_prompts` prompts) the policy's reward is measured on."""
    return [
        make_prompt(*_operands(hashlib.sha256(HELD_OUT_DOMAIN + struct.pack(">I", i)).digest(), cfg.digits))
        for i in range(cfg.held_out_prompts)
    ]


def sft_examples(seed: int, step: int, count: int, cfg: RLConfig) -> list[tuple[bytes, bytes]]:
    """(prompt, correct answer) pairs for supervised step `step` of the warm start seeded by `seed`."""
    prefix = SFT_DOMAIN + struct.pack(">QQ", seed, step)
    prompts = [
        make_prompt(*_operands(hashlib.sha256(prefix + struct.pack(">I", i)).digest(), cfg.digits))
        for i in range(count)
    ]
    return [(p, answer(p)) for p in prompts]


def max_prompt_bytes(cfg: RLConfig) -> int:
    """Longest prompt of the task: two operands of `digits` digits, '+' and '='."""
    return 2 * cfg.digits + 2


def verify_group(group: RolloutGroup, cfg: RLConfig) -> str | None:
    """Why a peer's rollout group cannot be used (shape or claimed rewards), or None when it is sound.

    Checks the group size, the completion lengths against `max_new_tokens`, that the prompt is a
    task prompt and that every claimed reward equals the recomputed one (within float32 rounding).
    Whether the prompts are the ones its worker was assigned is the caller's check (`problems_for`).
    """
    if len(group.completions) != cfg.group_size:
        return f"group of {len(group.completions)} completions, the run uses {cfg.group_size}"
    if any(len(c) > cfg.max_new_tokens for c in group.completions):
        return f"a completion is longer than max_new_tokens ({cfg.max_new_tokens})"
    try:
        actual = [reward(group.prompt, c) for c in group.completions]
    except ValueError as exc:
        return str(exc)
    for claimed, true in zip(group.rewards, actual, strict=True):
        if abs(claimed - true) > REWARD_TOLERANCE:
            return f"claimed reward {claimed:.4g} for a completion that earns {true:.4g}"
    return None


def verify_groups(groups: Sequence[RolloutGroup], prompts: Sequence[bytes], cfg: RLConfig) -> str | None:
    """`verify_group` for each group, and the prompts in order must be exactly `prompts` (the assignment)."""
    if [g.prompt for g in groups] != list(prompts):
        return "the prompts are not the worker's assigned problems"
    for group in groups:
        problem = verify_group(group, cfg)
        if problem is not None:
            return problem
    return None
