"""The supervised warm start of an RL run (W_0), cached on disk like the LM base model (`basecache.py`).

GRPO learns only from groups whose rewards differ, so a random policy (reward ~0 everywhere)
gives it nothing. W_0 is therefore the GPT after `cfg.warm_start_steps` AdamW steps of
cross-entropy on correct answers (`task.sft_examples`), loss on the answer bytes only: enough to
answer some problems, far from all, so RL has room to improve it.

The file is `<cache dir>/rl-warmstart/<key>.safetensors` (FP32 weights, never pickle), the key a
hash of everything that decides the weights: recipe version, model config, seed, digits, steps,
learning rate, optimizer and batch size. Its metadata holds the key and the state's SHA-256; a file
that is unreadable, from another key or with other content is logged, ignored and rebuilt.
Training runs on one CPU thread, so the weights do not depend on the caller's thread count (which
changes the order of float reductions, and 300 steps amplify that into a different W_0); another
CPU architecture or torch build may still differ, which is why only the validator's W_0 counts:
everyone else joins from its checkpoint. The first call trains (seconds), later calls read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from node.events import steps
from node.learn.basecache import InvalidCache, default_cache_dir, read_cached_state, write_cached_state
from node.learn.model import GPT, GPTConfig, build_gpt
from node.learn.rl.config import RLConfig
from node.learn.rl.grpo import completion_tensors
from node.learn.rl.task import sft_examples
from node.learn.train import InnerOptimConfig, derive_seed, load_state, make_optimizer, unique_state

log = logging.getLogger(__name__)

RECIPE_VERSION = 2  # bump when the recipe below changes in a way the key does not see
THREADS = 1  # CPU threads of the training: another count changes float reduction order, and so W_0
BATCH_SIZE = 64  # examples per step
FOLDER = "rl-warmstart"


def warm_start_optim(cfg: RLConfig) -> InnerOptimConfig:
    return InnerOptimConfig(lr=cfg.warm_start_lr, warmup_steps=max(1, cfg.warm_start_steps // 10))


def cache_key(gpt: GPTConfig, seed: int, cfg: RLConfig) -> str:
    recipe = {
        "version": RECIPE_VERSION,
        "model": gpt.model_dump(),
        "seed": seed,
        "digits": cfg.digits,
        "steps": cfg.warm_start_steps,
        "optim": warm_start_optim(cfg).model_dump(),
        "batch_size": BATCH_SIZE,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def cache_path(gpt: GPTConfig, seed: int, cfg: RLConfig, cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / FOLDER / f"{cache_key(gpt, seed, cfg)}.safetensors"


def warm_start(gpt: GPTConfig, seed: int, cfg: RLConfig, cache_dir: Path | None = None) -> dict[str, torch.Tensor]:
    """FP32 weights of W_0 (names as `unique_state` gives them): from the cache, or trained now and cached."""
    key = cache_key(gpt, seed, cfg)
    path = cache_path(gpt, seed, cfg, cache_dir)
    if path.exists():
        try:
            return read_cached_state(path, key)[0]
        except InvalidCache as exc:
            log.warning("warm-start cache %s rejected (%s); rebuilding it", path, exc)
    model = build_gpt(gpt, seed)
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)  # the same W_0 whatever the caller's thread count (one CPU build)
    try:
        loss = train_sft(model, cfg, seed)
    finally:
        torch.set_num_threads(threads)
    state = {name: t.detach().cpu().float().contiguous() for name, t in unique_state(model).items()}
    write_cached_state(path, state, key, {"final_loss": loss})
    log.info(
        "rl warm start: %d steps in %.1f s, answer loss %.3f, cached at %s",
        cfg.warm_start_steps,
        time.perf_counter() - start,
        loss,
        path,
    )
    return state


def train_sft(model: GPT, cfg: RLConfig, seed: int) -> float:
    """`cfg.warm_start_steps` supervised steps in place; the mean answer loss of the last tenth (nan for 0 steps)."""
    optim = warm_start_optim(cfg)
    opt = make_optimizer(model, optim)
    data_seed = derive_seed("rl-warm-start", seed)
    model.train()
    recent: list[float] = []
    for step in steps(range(cfg.warm_start_steps), "RL warm start: supervised steps (cached once)"):
        for group in opt.param_groups:
            group["lr"] = optim.lr_at(step)
        tokens, mask = completion_tensors(sft_examples(data_seed, step, BATCH_SIZE, cfg), model.cfg.block_size)
        logits = model(tokens[:, :-1])  # (B, T-1, V)
        per_token = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
        loss = (per_token * mask).sum() / mask.sum()  # answer bytes only: the prompt is given
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        opt.step()
        recent = [*recent, loss.item()][-max(1, cfg.warm_start_steps // 10) :]
    return sum(recent) / len(recent) if recent else float("nan")


def warm_model(gpt: GPTConfig, seed: int, cfg: RLConfig, cache_dir: Path | None = None) -> GPT:
    """A GPT holding W_0 (FP32)."""
    model = build_gpt(gpt, seed)
    load_state(model, warm_start(gpt, seed, cfg, cache_dir))
    return model
