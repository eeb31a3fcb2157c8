"""Sampling completions from the policy: rollout groups for the workers, greedy answers for evaluation.

Every prompt is repeated G times and all rows are decoded together, right-padded in one (N, T)
buffer on the model's device. The GPT is causal, so bytes after a row's end never change that
row's logits: each step runs the model on the buffer and reads every row's logits at its own last
byte. Completions are short (a few bytes), so a KV cache would save little; each row therefore sees
exactly the positions it will have when the trainer scores prompt + completion from position 0.

Deterministic for a given model state and seed: random numbers come from one `torch.Generator`,
drawn for every row at every step (finished rows too), so the stream does not depend on which
rows finished first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from node.learn.model import CausalLM
from node.learn.rl.config import RLConfig
from node.learn.rl.task import TERMINATOR, reward
from node.learn.train import derive_seed
from protocol.rollouts import RolloutGroup

_STOP = TERMINATOR[0]


def rollout_seed(run_id: str, round_: int, worker: str) -> int:
    """The sampling seed of `worker`'s batch in `round_`: public, so a batch can be regenerated and compared."""
    return derive_seed("rl-rollouts", run_id, round_, worker)


def _device(model: CausalLM) -> torch.device:
    return next(model.parameters()).device


def _block_size(model: CausalLM) -> int | None:
    cfg = getattr(model, "cfg", None)
    return getattr(cfg, "block_size", None)


@torch.no_grad()
def _decode(
    model: CausalLM,
    prompts: Sequence[bytes],
    max_new_tokens: int,
    temperature: float | None,
    generator: torch.Generator | None,
) -> list[bytes]:
    """One completion per prompt; `temperature` None means greedy (argmax)."""
    if not prompts:
        return []
    if any(not p for p in prompts):
        raise ValueError("a prompt is empty")
    longest = max(len(p) for p in prompts) + max_new_tokens
    block = _block_size(model)
    if block is not None and longest > block:
        raise ValueError(f"prompt + {max_new_tokens} new bytes is {longest} tokens, beyond block_size {block}")
    device = _device(model)
    n = len(prompts)
    buf = torch.zeros(n, longest, dtype=torch.long, device=device)  # (N, T) right-padded
    for i, p in enumerate(prompts):
        buf[i, : len(p)] = torch.tensor(list(p), dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompts], device=device)  # (N,) bytes so far
    start = lengths.clone()
    done = torch.zeros(n, dtype=torch.bool, device=device)
    rows = torch.arange(n, device=device)
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            width = int(lengths.max())
            logits = model(buf[:, :width])[rows, lengths - 1].float()  # (N, V) at each row's last byte
            if temperature is None:
                token = logits.argmax(dim=-1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (N,)
            live = ~done
            buf[rows[live], lengths[live]] = token[live]
            lengths = lengths + live.long()
            done = done | (live & (token == _STOP))
            if bool(done.all()):
                break
    finally:
        model.train(was_training)
    out = buf.cpu()
    return [bytes(out[i, int(s) : int(e)].tolist()) for i, (s, e) in enumerate(zip(start, lengths, strict=True))]


def rollout_groups(model: CausalLM, prompts: Sequence[bytes], cfg: RLConfig, seed: int) -> list[RolloutGroup]:
    """`cfg.group_size` completions per prompt at `cfg.temperature`, scored with the task's reward.

    A completion ends at the terminator (kept) or after `cfg.max_new_tokens` bytes.
    """
    generator = torch.Generator(device=_device(model)).manual_seed(seed)
    rows = [p for p in prompts for _ in range(cfg.group_size)]  # prompt i -> rows i*G .. i*G+G-1
    completions = _decode(model, rows, cfg.max_new_tokens, cfg.temperature, generator)
    groups = []
    for i, prompt in enumerate(prompts):
        mine = tuple(completions[i * cfg.group_size : (i + 1) * cfg.group_size])
        groups.append(RolloutGroup(prompt, mine, tuple(reward(prompt, c) for c in mine)))
    return groups


def greedy(model: CausalLM, prompts: Sequence[bytes], max_new_tokens: int) -> list[bytes]:
    """The argmax completion of each prompt, ending at the terminator or after `max_new_tokens` bytes."""
    return _decode(model, prompts, max_new_tokens, None, None)
