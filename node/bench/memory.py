"""memory: a miner's memory options (BF16 moments, checkpointing, BF16 error feedback): loss, bytes, state.

Each variant is a `train.memory` setting (`node.learn.train.MemoryConfig`) in the home-GPU
preset's recipe (PULSELoCo with BF16 values, Nesterov outer step 0.7 / 0.9, weight decay 0.1) on
the embedded GPT: R real `Trainer`s (the miner's own code: H inner steps on its assignment,
compression with error feedback) per round, their payloads decoded, clipped to the median norm
and averaged (`validator.aggregate`), the outer step applied, the BF16 weights shipped to the next
round. Two regimes as in `pulse bench loco`: pre-training from scratch (inner lr 1e-3) and
fine-tuning from the cached base (the preset's inner lr, 3e-6). Every variant of a regime sees the
same keys, assignments and starting weights.

Reported per variant: held-out loss on the final BF16 weights and its difference to today's
default, payload bytes per round, and what a miner holds, counted on its live tensors: weights +
gradients + optimizer state per parameter (what sits on a GPU), activations kept for the backward
pass per token, the error buffer per parameter (host), and what the first would be at 1.5B.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from node.bench.footprint import miner_state, probe_step
from node.bench.report import BenchResult, table
from node.learn.basecache import load_or_train
from node.learn.data import stdlib_corpus
from node.learn.hfmodel import QWEN2_5_1_5B, count_hf_parameters
from node.learn.model import GPTConfig, build_gpt
from node.learn.train import MemoryConfig, bf16_state, derive_seed, evaluate, load_bf16_state, unique_state
from node.run.manifest import Manifest, codec_for, load_manifest, parse_manifest
from node.run.presets import configs_dir
from node.run.setup import RunSetup
from node.run.trainer import LMTrainer, MinerSpec
from node.swarm.fakeminers import identity_for
from protocol.parsing import STRICT
from protocol.state import State
from validator.aggregate import aggregate
from validator.outer import OuterOptimizer

EVAL_BATCHES = 8
EVAL_BATCH_SIZE = 16
GIB = 2**30


def variants(home: MemoryConfig) -> dict[str, MemoryConfig]:
    return {
        "default (today)": MemoryConfig(),
        "checkpointing": MemoryConfig(checkpointing=True),
        "bf16 moments": MemoryConfig(moments="bf16"),
        "bf16 error feedback": MemoryConfig(error_feedback="bf16"),
        "bf16 pseudo-gradient": MemoryConfig(pseudo_gradient="bf16"),
        "home preset": home,
    }


class Options(BaseModel):
    """`pulse bench memory`'s options."""

    model_config = STRICT

    regime: Literal["pretrain", "finetune", "both"] = "both"
    """pre-training from scratch, fine-tuning the cached base, or both"""
    replicas: int = Field(default=4, ge=1)
    """miners per round"""
    rounds: int = Field(default=10, ge=1)
    """rounds per variant"""
    inner_steps: int = Field(default=10, ge=1)
    """H"""
    batch_size: int = Field(default=8, ge=1)
    """sequences per inner step"""
    n_layer: int = Field(default=4, ge=1)
    """GPT blocks (loco's size: the cached base is shared)"""
    n_embd: int = Field(default=128, ge=1)
    """GPT channels"""
    threads: int = Field(default=1, ge=1)
    """torch CPU threads"""

    def regimes(self) -> tuple[str, ...]:
        """The regimes `--regime` names."""
        return ("pretrain", "finetune") if self.regime == "both" else (self.regime,)


@dataclass
class Outcome:
    final_loss: float
    payload_bytes: float  # per miner per round
    state_bpp: float  # weights + gradients + optimizer state, per parameter
    activations_per_token: float
    error_bpp: float
    seconds: float  # per miner per round: training and compression


def run(options: Options) -> BenchResult:
    torch.set_num_threads(options.threads)
    home = load_manifest(configs_dir() / "qwen2.5-0.5b-home-gpu.toml")
    cfg = GPTConfig(n_layer=options.n_layer, n_embd=options.n_embd)
    corpus = stdlib_corpus()
    held = [corpus.batch(derive_seed("memory-eval", i), EVAL_BATCH_SIZE, cfg.block_size, "held_out") for i in range(8)]
    results: dict[str, dict[str, Outcome]] = {}
    starts: dict[str, float] = {}
    for regime in options.regimes():
        finetune = regime == "finetune"
        base = load_or_train(cfg, corpus=corpus).model if finetune else build_gpt(cfg)
        init = {n: t.detach().clone().float() for n, t in unique_state(base).items()}
        probe = build_gpt(cfg)
        load_bf16_state(probe, bf16_state(base))
        starts[regime] = evaluate(probe, held)
        shared = manifest(home, cfg, options, MemoryConfig(), finetune).run_id
        results[regime] = {
            name: run_variant(manifest(home, cfg, options, memory, finetune), shared, init, options, held)
            for name, memory in variants(home.train.memory).items()
        }
    return _result(results, starts, options, home)


def manifest(home: Manifest, cfg: GPTConfig, options: Options, memory: MemoryConfig, finetune: bool) -> Manifest:
    """The home preset's recipe on the embedded GPT, with `memory`."""
    train = home.train.model_dump(mode="python")
    train.update(inner_steps=options.inner_steps, memory=memory.model_dump(), overlap=False)
    if not finetune:
        train["inner"].update(lr=1e-3, warmup_steps=20)
    return parse_manifest(
        {
            "name": "bench-memory",
            "model": {"kind": "gpt", "gpt": cfg.model_dump()},
            "data": {"batch_size": options.batch_size, "seq_len": cfg.block_size},
            "train": train,
            # the preset's fresh batch per step, as far as these steps go (a manifest refuses more)
            "selection": {"assignment_batches": min(home.selection.assignment_batches, options.inner_steps)},
        },
        "pulse bench memory",
    )


def run_variant(m: Manifest, data_run_id: str, init: State, options: Options, held: list[Any]) -> Outcome:
    """The variant's miners draw the assignments of `data_run_id`: every variant's manifest (so its run
    id) differs, but all of them must train on the same data."""
    setup = RunSetup.from_manifest(m)
    spec = replace(MinerSpec.from_manifest(m), run_id=data_run_id)
    replicas, rounds = options.replicas, options.rounds
    codec = codec_for(m)
    outer = OuterOptimizer(m.train.outer, init)
    miners = [
        LMTrainer(spec, setup.new_model(initial=False), identity_for(f"memory/{i}"), setup.batch)
        for i in range(replicas)
    ]
    payload_bytes, seconds = 0, 0.0
    for r in range(rounds):
        weights = outer.bf16_weights()
        payloads = []
        for miner in miners:
            start = time.perf_counter()
            _, payload = miner.package(r, miner.train(r, weights), weights, "0" * 64)
            seconds += time.perf_counter() - start
            payloads.append(payload)
        payload_bytes += sum(len(p) for p in payloads)
        outer.step(aggregate(payloads, functools.partial(codec.decompress, weights=weights)).update)
    model = setup.new_model()
    load_bf16_state(model, outer.bf16_weights())
    state = miner_state(miners[0])
    step = probe_step(miners[0].model, setup.batch(0), torch.autocast("cpu", enabled=False))
    return Outcome(
        final_loss=evaluate(model, held),
        payload_bytes=payload_bytes / (rounds * replicas),
        state_bpp=(state.weight_bytes + step.grad_bytes + state.optimizer_bytes) / state.params,
        activations_per_token=step.activation_bytes / step.tokens,
        error_bpp=state.error_bytes / state.params,
        seconds=seconds / (rounds * replicas),
    )


def _result(
    results: dict[str, dict[str, Outcome]], starts: dict[str, float], options: Options, home: Manifest
) -> BenchResult:
    params_1_5b = count_hf_parameters(QWEN2_5_1_5B)
    summary: dict[str, Any] = {"home_preset_memory": home.train.memory.model_dump(), "regimes": {}}
    tables = []
    for regime, rows in results.items():
        default = rows["default (today)"]
        summary["regimes"][regime] = {
            name: {**o.__dict__, "loss_vs_default": o.final_loss / default.final_loss - 1} for name, o in rows.items()
        }
        lines = [
            [
                name,
                f"{o.final_loss:.4f}",
                f"{100 * (o.final_loss / default.final_loss - 1):+.2f}%",
                f"{o.payload_bytes:,.0f}",
                o.state_bpp,
                f"{o.state_bpp * params_1_5b / GIB:.1f}",
                f"{o.activations_per_token:,.0f}",
                o.error_bpp,
                o.seconds,
            ]
            for name, o in rows.items()
        ]
        title = (
            f"memory {regime}: {options.replicas} miners x {options.rounds} rounds x H={options.inner_steps}, "
            f"start loss {starts[regime]:.4f}"
        )
        columns = ["variant", "loss", "vs default", "bytes/round", "GPU B/param", "at 1.5B GiB", "act B/token",
                   "host EF B/param", "s/round"]  # fmt: skip
        tables.append(table(title, columns, lines))
    return BenchResult(summary=summary, tables=tables)
