"""A briefly pre-trained base model, cached on disk so a second call costs a file read.

Update traces and convergence runs should start from a model that has learned something: a
freshly initialized one has unrepresentative weight magnitudes and gradients. The cache file is
`<cache dir>/base/<key>.safetensors` (FP32 weights, never pickle), where the key hashes everything
that decides the weights: recipe version, model config, steps, seed, optimizer, batch shape and
the corpus (byte counts + SHA-256). Its metadata holds the key and the state's SHA-256; a file that
is unreadable, from another key or with other content is logged, ignored and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from node.events import progress as bar
from node.learn.data import Corpus, stdlib_corpus
from node.learn.model import GPT, GPTConfig, build_gpt
from node.learn.train import (
    InnerOptimConfig,
    corpus_batches,
    derive_seed,
    evaluate,
    inner_train,
    load_state,
    unique_state,
)
from protocol.statehash import state_hash
from validator.atomicfile import write_atomic

log = logging.getLogger(__name__)

RECIPE_VERSION = 1  # bump when the training recipe below changes in a way the key does not see
DEFAULT_STEPS = 300
BATCH_SIZE = 16  # sequences of cfg.block_size bytes
BASE_OPTIM = InnerOptimConfig(lr=1e-3, warmup_steps=30)
EVAL_BATCHES = 8  # held-out batches for the before/after loss


class InvalidCache(Exception):
    """A cache file that must not be used (the reason is the message)."""


@dataclass(frozen=True)
class CachedBase:
    model: GPT
    key: str
    path: Path
    loss_before: float  # held-out loss of the fresh initialization
    loss_after: float  # held-out loss after pre-training
    train_seconds: float  # of the run that built the file
    from_cache: bool


def default_cache_dir() -> Path:
    """`$PULSE_CACHE_DIR`, else `~/.cache/pulse`."""
    env = os.environ.get("PULSE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "pulse"


def corpus_digest(corpus: Corpus) -> str:
    """Identity of a corpus: split sizes and the SHA-256 of both splits."""
    h = hashlib.sha256()
    for split in (corpus.train, corpus.held_out):
        h.update(len(split).to_bytes(8, "little"))
        h.update(split.numpy().data)  # (N,) uint8, contiguous: no copy
    return f"{len(corpus.train)}+{len(corpus.held_out)}:{h.hexdigest()}"


def cache_key(cfg: GPTConfig, steps: int, seed: int, corpus: Corpus) -> str:
    recipe = {
        "version": RECIPE_VERSION,
        "model": cfg.model_dump(),
        "steps": steps,
        "seed": seed,
        "optim": BASE_OPTIM.model_dump(),
        "batch_size": BATCH_SIZE,
        "corpus": corpus_digest(corpus),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def base_model(
    cfg: GPTConfig | None = None,
    steps: int = DEFAULT_STEPS,
    cache_dir: Path | None = None,
    *,
    seed: int = 0,
    corpus: Corpus | None = None,
) -> GPT:
    """The base GPT (FP32), from the cache or trained now and cached; see `load_or_train`."""
    return load_or_train(cfg, steps, cache_dir, seed=seed, corpus=corpus).model


def load_or_train(
    cfg: GPTConfig | None = None,
    steps: int = DEFAULT_STEPS,
    cache_dir: Path | None = None,
    *,
    seed: int = 0,
    corpus: Corpus | None = None,
) -> CachedBase:
    """The base GPT with its cache key and losses. `corpus` defaults to the embedded one."""
    cfg = cfg or GPTConfig()
    corpus = corpus if corpus is not None else stdlib_corpus()
    key = cache_key(cfg, steps, seed, corpus)
    path = (cache_dir or default_cache_dir()) / "base" / f"{key}.safetensors"
    if path.exists():
        try:
            return _load(path, cfg, key)
        except InvalidCache as exc:
            log.warning("base model cache %s rejected (%s); rebuilding it", path, exc)
    model = build_gpt(cfg, seed)
    start = time.perf_counter()
    before, after = _pretrain(model, corpus, steps, seed)
    seconds = time.perf_counter() - start
    _save(path, model, key, {"loss_before": before, "loss_after": after, "train_seconds": seconds})
    log.info(
        "base model: %d steps in %.1f s, held-out loss %.3f -> %.3f, cached at %s",
        steps,
        seconds,
        before,
        after,
        path,
    )
    return CachedBase(model, key, path, before, after, seconds, from_cache=False)


def _pretrain(model: GPT, corpus: Corpus, steps: int, seed: int) -> tuple[float, float]:
    """Train in place; held-out loss before and after."""
    seq = model.cfg.block_size
    held = [corpus.batch(derive_seed("base-eval", i), BATCH_SIZE, seq, "held_out") for i in range(EVAL_BATCHES)]
    before = evaluate(model, held)
    every, start, recent = max(1, steps // 10), time.perf_counter(), []

    def progress(step: int, loss: float) -> None:
        recent.append(loss)
        if (step + 1) % every == 0 or step + 1 == steps:
            log.info(
                "base model: step %d/%d, train loss %.3f, %.0f s",
                step + 1,
                steps,
                sum(recent) / len(recent),
                time.perf_counter() - start,
            )
            recent.clear()

    log.info("base model: training %d steps (held-out loss %.3f at init)", steps, before)
    batches = corpus_batches(corpus, derive_seed("base", seed), BATCH_SIZE, seq)
    with bar("pre-training the base model (cached once)", steps) as advance:

        def step_done(step: int, loss: float) -> None:
            progress(step, loss)
            advance(1)

        inner_train(model, BASE_OPTIM, batches, steps, on_step=step_done)
    return before, evaluate(model, held)


def write_cached_state(path: Path, state: dict[str, torch.Tensor], key: str, stats: dict[str, float]) -> None:
    """FP32 `state` as safetensors (never pickle), its key and SHA-256 (and `stats`) in the metadata, atomically."""
    meta = {"key": key, "state_sha256": state_hash(state), **{k: repr(v) for k, v in stats.items()}}
    write_atomic(path, save(state, metadata=meta))


def read_cached_state(path: Path, key: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(state, metadata) of a file `write_cached_state` wrote for `key`; `InvalidCache` says why not."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError) as exc:
        raise InvalidCache(f"unreadable: {exc}") from exc
    if meta.get("key") != key:
        raise InvalidCache("written for another key")
    if meta.get("state_sha256") != state_hash(state):
        raise InvalidCache("content does not match its recorded SHA-256")
    return state, meta


def _save(path: Path, model: GPT, key: str, stats: dict[str, float]) -> None:
    state = {name: t.detach().cpu().contiguous() for name, t in unique_state(model).items()}
    write_cached_state(path, state, key, stats)


def _load(path: Path, cfg: GPTConfig, key: str) -> CachedBase:
    state, meta = read_cached_state(path, key)
    model = build_gpt(cfg)  # its initial weights are all overwritten
    try:
        load_state(model, state)
        stats = {k: float(meta[k]) for k in ("loss_before", "loss_after", "train_seconds")}
    except (ValueError, KeyError) as exc:
        raise InvalidCache(str(exc)) from exc
    return CachedBase(
        model, key, path, stats["loss_before"], stats["loss_after"], stats["train_seconds"], from_cache=True
    )
