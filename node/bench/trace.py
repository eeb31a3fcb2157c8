"""trace: a real BF16 update trace of the embedded GPT and how sparse its per-step changes are.

From the cached briefly pre-trained base (`node.learn.basecache`), N AdamW steps at a constant LR on
FP32 master weights; after each step the BF16 copy (what a node ships) is snapshotted. The trace
for the requested LR is written as `DIR/step_0000.safetensors` (the starting state) ..
`step_NNNN.safetensors` plus `DIR/trace.json`; the sweep over `SWEEP_LRS` runs in memory. The
table is the fraction of BF16 weights whose bits are unchanged between step t and t+k, averaged
over t: k = 1 is the synchronous case, larger k a peer that syncs k steps late.

`make_hf_trace` makes the same kind of trace at the size users run: a model of Qwen2.5-0.5B's
architecture (`node.learn.hfmodel.QWEN2_5_0_5B`, seeded weights, nothing downloaded), AdamW on
byte ids of the embedded corpus, each BF16 state written to disk as soon as it exists (about
1 GB each), so a later run reads the cached trace instead of training again.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field
from safetensors.torch import load_file, save

from node.bench.report import BenchResult, table
from node.events import progress
from node.learn.basecache import DEFAULT_STEPS, CachedBase, default_cache_dir, load_or_train
from node.learn.data import Corpus, stdlib_corpus
from node.learn.hfmodel import QWEN2_5_0_5B, build_hf_from_config
from node.learn.model import GPT
from node.learn.train import (
    BatchFn,
    InnerOptimConfig,
    StepHook,
    bf16_state,
    corpus_batches,
    derive_seed,
    evaluate,
    inner_train,
)
from protocol.parsing import STRICT
from protocol.state import State, StateDict
from protocol.statehash import state_hash
from validator.atomicfile import write_atomic

SWEEP_LRS = (1e-6, 3e-6, 1e-5, 1e-4)
DELAYS = (1, 8, 32)
BATCH_SIZE = 8  # sequences of block_size bytes per step: modest, so the sweep fits 2 CPU cores
MANIFEST = "trace.json"
FORMAT = "pulse-trace/v2"  # v2: the manifest's digests are state hashes v2 (protocol/statehash.py)
EVAL_BATCHES = 8  # held-out batches for the loss column
MASTER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Trace:
    lr: float
    states: list[StateDict]  # BF16, steps + 1 of them: before the first step, then after each
    losses: list[float]  # training loss of each step
    model: GPT  # the master weights after the last step


def trace_states(model: GPT, lr: float, steps: int, batches: BatchFn) -> Trace:
    """Train `model` in place for `steps` AdamW steps at a constant `lr`, snapshotting BF16 states.

    The model's dtype is the master precision: FP32 accumulates sub-ulp updates until the BF16
    copy flips; a BF16 model drops every update smaller than half a BF16 ulp.
    """
    states = [bf16_state(model)]
    with progress(f"trace at lr {lr:g}", steps) as advance:

        def snapshot(_step: int, _loss: float) -> None:
            states.append(bf16_state(model))
            advance(1)

        losses = inner_train(model, InnerOptimConfig(lr=lr), batches, steps, on_step=snapshot)
    return Trace(lr, states, losses, model)


def unchanged_fraction(states: Sequence[State], k: int) -> float | None:
    """Mean over t of the fraction of weights with identical bits in states t and t+k (None if k too big)."""
    if k >= len(states):
        return None
    total = sum(t.numel() for t in states[0].values())
    fractions = [_same_bits(states[t], states[t + k]) / total for t in range(len(states) - k)]
    return sum(fractions) / len(fractions)


def _same_bits(a: State, b: State) -> int:
    # compare bit patterns, not values: -0.0 == 0.0 would hide a change the patch must carry
    return sum(int((a[n].view(torch.int16) == b[n].view(torch.int16)).sum()) for n in a)


def write_trace(out_dir: Path, states: Sequence[StateDict], info: dict[str, Any]) -> None:
    """Write `states` as step files and the manifest (last, so a present manifest means a whole trace)."""
    begin_trace(out_dir)
    files = [write_step(out_dir, i, state) for i, state in enumerate(states)]
    finish_trace(out_dir, files, info)


def begin_trace(out_dir: Path) -> None:
    """Make `out_dir` ready for a new trace: no manifest until the trace is whole."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)


def write_step(out_dir: Path, i: int, state: StateDict) -> dict[str, str]:
    """Write state i of a trace; its manifest entry."""
    digest = state_hash(state)
    name = f"step_{i:04d}.safetensors"
    write_atomic(out_dir / name, save(state, metadata={"step": str(i), "state_sha256": digest}))
    return {"file": name, "sha256": digest}


def finish_trace(out_dir: Path, files: list[dict[str, str]], info: dict[str, Any]) -> None:
    """Drop step files of an earlier, longer trace, then write the manifest."""
    keep = {f["file"] for f in files}
    for stale in out_dir.glob("step_*.safetensors"):
        if stale.name not in keep:
            stale.unlink()
    manifest = {"format": FORMAT, **info, "files": files}
    write_atomic(out_dir / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())


def read_manifest(trace_dir: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((trace_dir / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{trace_dir / MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def iter_trace(trace_dir: Path) -> Iterator[StateDict]:
    """The BF16 states of a written trace in step order, each checked against its manifest SHA-256."""
    for entry in read_manifest(trace_dir)["files"]:
        name = entry["file"]
        if Path(name).name != name:
            raise ValueError(f"trace file name {name!r} is not a plain file name")
        state = load_file(trace_dir / name)
        if state_hash(state) != entry["sha256"]:
            raise ValueError(f"{trace_dir / name}: content does not match the manifest SHA-256")
        yield state


def trace_pairs(trace_dir: Path, delay: int) -> Iterator[tuple[StateDict, StateDict]]:
    """(state t, state t + delay) for every t, holding only delay + 1 states at a time."""
    window: list[StateDict] = []
    for state in iter_trace(Path(trace_dir)):
        window.append(state)
        if len(window) > delay:
            yield window[0], window[-1]
            window.pop(0)


def load_trace(trace_dir: Path) -> list[StateDict]:
    """All states of a trace (steps + 1 of them, ~6.5 MB each for the default model)."""
    return list(iter_trace(Path(trace_dir)))


def run_lr(base: CachedBase, corpus: Corpus, lr: float, steps: int, *, seed: int = 0, master: str = "fp32") -> Trace:
    """The trace at one LR from a copy of the base; every LR sees the same batches."""
    model = copy.deepcopy(base.model).to(MASTER_DTYPES[master])
    batches = corpus_batches(corpus, derive_seed("trace", seed), BATCH_SIZE, model.cfg.block_size)
    return trace_states(model, lr, steps, batches)


def make_trace(
    out_dir: Path, base: CachedBase, corpus: Corpus, lr: float, steps: int, *, seed: int = 0, master: str = "fp32"
) -> Trace:
    """`run_lr`, then write the trace and its manifest to `out_dir`."""
    trace = run_lr(base, corpus, lr, steps, seed=seed, master=master)
    info = {
        "lr": lr,
        "steps": steps,
        "seed": seed,
        "master": master,
        "batch_size": BATCH_SIZE,
        "model": base.model.cfg.model_dump(),
        "optim": InnerOptimConfig(lr=lr).model_dump(),
        "base_cache_key": base.key,
        "losses": trace.losses,
    }
    write_trace(out_dir, trace.states, info)
    return trace


HF_BATCH = 4  # sequences of HF_SEQ byte ids per step: one step of the 0.5B model fits a CPU node
HF_SEQ = 128
HF_MODELS = {"qwen2-0.5b": QWEN2_5_0_5B}


def hf_trace_dir(cache_dir: Path, model: str, lr: float, seed: int = 0) -> Path:
    return cache_dir / f"trace-{model}-lr{lr:g}-seed{seed}"


def make_hf_trace(
    out_dir: Path, model_name: str, lr: float, steps: int, *, seed: int = 0, device: str = "cpu"
) -> list[float]:
    """AdamW steps (FP32 master on `device`) of a seeded model of `model_name`'s architecture on the
    embedded corpus' byte ids; each BF16 state is written as it comes. Returns the step losses."""
    model = build_hf_from_config(HF_MODELS[model_name], seed).to(device)
    cpu_batches = corpus_batches(stdlib_corpus(), derive_seed("hf-trace", seed), HF_BATCH, HF_SEQ)

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = cpu_batches(step)
        return x.to(device), y.to(device)

    begin_trace(out_dir)
    files = [write_step(out_dir, 0, bf16_state(model))]
    snapshot: StepHook = lambda step, _loss: files.append(write_step(out_dir, step + 1, bf16_state(model)))  # noqa: E731
    start = time.perf_counter()
    losses = inner_train(model, InnerOptimConfig(lr=lr), batches, steps, on_step=snapshot)
    info = {
        "lr": lr,
        "steps": steps,
        "seed": seed,
        "master": "fp32",
        "model": model_name,
        "batch_size": HF_BATCH,
        "seq_len": HF_SEQ,
        "optim": InnerOptimConfig(lr=lr).model_dump(),
        "losses": losses,
        "train_seconds": time.perf_counter() - start,
        "device": device,
    }
    finish_trace(out_dir, files, info)
    return losses


class Options(BaseModel):
    """`pulse bench trace`'s options."""

    model_config = STRICT

    out: Path | None = None
    """trace folder (default: <cache dir>/trace)"""
    lr: float = Field(default=1e-6, gt=0, allow_inf_nan=False)
    """learning rate of the written trace"""
    steps: int = Field(default=40, ge=1)
    """AdamW steps per trace (>= 33 to measure k=32)"""
    cache_dir: Path | None = None
    """base model cache ($PULSE_CACHE_DIR)"""
    base_steps: int = Field(default=DEFAULT_STEPS, ge=0)
    """pre-training steps of the base"""
    master: Literal["bf16", "fp32"] = "fp32"
    """precision the optimizer updates: fp32 (a node's master weights) or bf16 (sub-ulp updates lost)"""


def run(options: Options) -> BenchResult:
    out_dir = options.out or (options.cache_dir or default_cache_dir()) / "trace"
    corpus = stdlib_corpus()
    base = load_or_train(None, options.base_steps, options.cache_dir, corpus=corpus)
    seq = base.model.cfg.block_size
    held = [corpus.batch(derive_seed("trace-eval", i), BATCH_SIZE, seq, "held_out") for i in range(EVAL_BATCHES)]
    rows: dict[str, dict[str, Any]] = {}
    for lr in sorted({*SWEEP_LRS, options.lr}):
        start = time.perf_counter()
        if lr == options.lr:
            trace = make_trace(out_dir, base, corpus, lr, options.steps, master=options.master)
        else:
            trace = run_lr(base, corpus, lr, options.steps, master=options.master)
        rows[f"{lr:g}"] = {
            "unchanged": {str(k): unchanged_fraction(trace.states, k) for k in DELAYS},
            "held_out_loss": evaluate(trace.model, held),
            "seconds": time.perf_counter() - start,
        }
        del trace  # ~6.5 MB per state for the default model
    return _result(options, out_dir, base, evaluate(base.model, held), rows)


def _result(
    options: Options, out_dir: Path, base: CachedBase, base_loss: float, rows: dict[str, dict[str, Any]]
) -> BenchResult:
    summary = {
        "unchanged": {lr: row["unchanged"] for lr, row in rows.items()},
        "held_out_loss": {"base": base_loss, **{lr: row["held_out_loss"] for lr, row in rows.items()}},
        "seconds": {lr: row["seconds"] for lr, row in rows.items()},
        "trace_dir": str(out_dir),
        "lr": options.lr,
        "steps": options.steps,
        "master": options.master,
        "batch_size": BATCH_SIZE,
        "base": {
            "cache_key": base.key,
            "steps": options.base_steps,
            "loss_before": base.loss_before,
            "loss_after": base.loss_after,
            "train_seconds": base.train_seconds,
            "from_cache": base.from_cache,
        },
    }
    base_table = table(
        "base model (held-out loss, nats/byte)",
        ["cache key", "steps", "at init", "trained", "train s", "from cache"],
        [[base.key[:16], options.base_steps, base.loss_before, base.loss_after, base.train_seconds, base.from_cache]],
    )
    title = (
        f"BF16 weights unchanged from step t to t+k ({options.master} master, {options.steps} steps, "
        f"held-out loss {base_loss:.3f} at start; lr {options.lr:g} written to {out_dir})"
    )
    columns = ["lr", *(f"k={k}" for k in DELAYS), "held-out loss", "s"]
    body = [
        [lr, *(_pct(row["unchanged"][str(k)]) for k in DELAYS), row["held_out_loss"], row["seconds"]]
        for lr, row in rows.items()
    ]
    return BenchResult(summary=summary, tables=[base_table, table(title, columns, body)])


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.2f}%"
