"""loco: convergence and traffic of DDP, dense DiLoCo, SparseLoCo and PULSELoCo on the embedded GPT.

R replicas run in one process, every method with the same seeds, data and token budget
(rounds x H inner steps x R x batch). Each round a replica loads the BF16 global weights, runs H
AdamW steps (its AdamW state persists across rounds), compresses W - W_local with its own
error-feedback buffer, and the validator path decodes, clips to the median norm, averages and
applies the outer step to the FP32 master (validator/). DDP averages gradients every step, i.e.
one AdamW run on the R batches together, and ships H dense FP32 gradients per round.

Two regimes: pre-training (inner lr 1e-3, from scratch) and fine-tuning (inner lr 1e-6, from
the cached base, node/learn/basecache.py). Every final loss is measured on the BF16 weights a node
would hold, on fixed held-out batches.

`--speed` measures something else: compress and decompress speed and peak memory of SparseLoCo
and PULSELoCo at 0.5B parameters, against a plain reference encoding (node/bench/locospeed.py).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field, field_validator

from node.bench.locospeed import run_speed
from node.bench.report import BenchResult, table
from node.events import steps
from node.learn.basecache import load_or_train
from node.learn.data import Corpus, stdlib_corpus
from node.learn.model import GPT, GPTConfig, build_gpt
from node.learn.train import (
    InnerOptimConfig,
    bf16_state,
    corpus_batches,
    derive_seed,
    evaluate,
    inner_train,
    load_bf16_state,
    make_optimizer,
    unique_state,
)
from protocol.codec import CodecStats, make_codec
from protocol.parsing import STRICT
from validator.aggregate import aggregate
from validator.outer import OuterConfig, OuterOptimizer

log = logging.getLogger(__name__)

EVAL_BATCHES = 8
EVAL_BATCH_SIZE = 16


@dataclass(frozen=True)
class Method:
    name: str
    codec: str | None  # None: DDP
    options: dict[str, Any] = field(default_factory=dict)
    outer: OuterConfig = field(default_factory=OuterConfig)


NESTEROV = OuterConfig(lr=0.7, momentum=0.9, nesterov=True)  # DiLoCo / grail PULSE-DiLoCo
METHODS = {
    m.name: m
    for m in [
        Method("ddp", None),
        Method("diloco", "dense", outer=NESTEROV),
        # plain SGD as Templar; lr 2 rather than 1.0: our mean divides coordinates that one replica
        # picked by R (Templar averages over the peers that picked each), and these runs are short
        Method("sparseloco", "sparseloco", outer=OuterConfig(lr=2.0, momentum=0.0)),
        Method("pulseloco", "pulseloco", {"value_format": "bf16"}, outer=NESTEROV),
        Method("pulseloco_fp32", "pulseloco", {"value_format": "fp32"}, outer=NESTEROV),
    ]
}


@dataclass(frozen=True)
class Regime:
    name: str
    inner_lr: float
    from_base: bool
    warmup_steps: int
    methods: tuple[str, ...]


_CORE = ("ddp", "diloco", "sparseloco", "pulseloco")
REGIMES = {
    "pretrain": Regime("pretrain", inner_lr=1e-3, from_base=False, warmup_steps=20, methods=_CORE),
    # FP32 values measured where PULSELoCo is meant to run; in pre-training both formats gate the same
    "finetune": Regime("finetune", inner_lr=1e-6, from_base=True, warmup_steps=0, methods=(*_CORE, "pulseloco_fp32")),
}


@dataclass
class Outcome:
    final_loss: float
    bytes_per_round: float  # per replica
    bits_per_value: float
    density: float  # sent values / elements
    seconds: float


@dataclass(frozen=True)
class Setup:
    """What every method of one regime shares."""

    cfg: GPTConfig
    init: dict[str, torch.Tensor]  # FP32 starting weights
    corpus: Corpus
    inner: InnerOptimConfig
    replicas: int
    rounds: int
    steps: int  # H
    batch_size: int
    seed: int

    def batches(self, replica: int) -> Any:
        return corpus_batches(
            self.corpus, derive_seed(self.seed, "replica", replica), self.batch_size, self.cfg.block_size
        )


def model_from(setup: Setup, state: dict[str, torch.Tensor]) -> GPT:
    model = build_gpt(setup.cfg)
    with torch.no_grad():
        for name, t in unique_state(model).items():
            t.copy_(state[name])
    return model


def train_ddp(setup: Setup) -> tuple[dict[str, torch.Tensor], float]:
    """Gradients averaged every step: one AdamW run on all replicas' batches. (BF16 weights, bytes/round)."""
    model = model_from(setup, setup.init)
    sources = [setup.batches(i) for i in range(setup.replicas)]

    def joint(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [src(step) for src in sources]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])

    inner_train(model, setup.inner, joint, setup.rounds * setup.steps)
    dense = 4 * sum(t.numel() for t in setup.init.values())
    return bf16_state(model), float(setup.steps * dense)


def train_loco(setup: Setup, method: Method) -> tuple[dict[str, torch.Tensor], list[CodecStats]]:
    """DiLoCo-family rounds through the codec and the validator path. (final BF16 weights, payload stats)."""
    assert method.codec is not None
    codec = make_codec(method.codec, **method.options)
    outer = OuterOptimizer(method.outer, setup.init)
    weights = outer.bf16_weights()
    models = [model_from(setup, setup.init) for _ in range(setup.replicas)]
    optimizers = [make_optimizer(m, setup.inner) for m in models]
    errors = [codec.initial_error(weights) for _ in models]
    sources = [setup.batches(i) for i in range(setup.replicas)]
    stats: list[CodecStats] = []
    for r in steps(range(setup.rounds), f"{method.name} rounds"):
        payloads = []
        for i, model in enumerate(models):
            load_bf16_state(model, weights)
            inner_train(
                model, setup.inner, sources[i], setup.steps, optimizer=optimizers[i], first_step=r * setup.steps
            )
            local = unique_state(model)
            delta = {name: weights[name].float() - local[name].detach() for name in weights}
            payload, errors[i], st = codec.compress(delta, errors[i], weights)
            payloads.append(payload)
            stats.append(st)
        result = aggregate(payloads, functools.partial(codec.decompress, weights=weights))
        outer.step(result.update)
        weights = outer.bf16_weights()
    return weights, stats


def run_regime(
    setup: Setup, methods: list[Method], held: list[tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    probe = build_gpt(setup.cfg)
    for method in methods:
        start = time.perf_counter()
        if method.codec is None:
            weights, per_round = train_ddp(setup)
            bits, density = 32.0, 1.0
        else:
            weights, stats = train_loco(setup, method)
            per_round = sum(s.payload_bytes for s in stats) / len(stats)
            bits = 8 * sum(s.payload_bytes for s in stats) / sum(s.sent for s in stats)
            density = sum(s.sent for s in stats) / sum(s.elements for s in stats)
        load_bf16_state(probe, weights)
        out[method.name] = Outcome(evaluate(probe, held), per_round, bits, density, time.perf_counter() - start)
    return out


class Options(BaseModel):
    """`pulse bench loco`'s options."""

    model_config = STRICT

    regime: Literal["pretrain", "finetune", "both"] = "both"
    """pre-training from scratch, fine-tuning the cached base, or both"""
    replicas: int = Field(default=4, ge=1)
    """R replicas (miners) per method"""
    rounds: int = Field(default=18, ge=1)
    """outer rounds per regime"""
    inner_steps: int = Field(default=10, ge=1)
    """H AdamW steps per round"""
    batch_size: int = Field(default=8, ge=1)
    """sequences per replica per step"""
    finetune_lr: float = Field(default=REGIMES["finetune"].inner_lr, gt=0, allow_inf_nan=False)
    """fine-tuning inner lr"""
    methods: str | None = Field(
        default=None,
        description=f"comma-separated subset of {','.join(METHODS)}, with ddp and diloco (default: the regime's)",
    )
    n_layer: int = Field(default=4, ge=1)
    """GPT blocks (small, so both regimes fit 2 CPU cores)"""
    n_embd: int = Field(default=128, ge=1)
    """GPT channels"""
    seed: int = 0
    """seed of the weights and of every replica's data"""
    threads: int = Field(default=1, ge=1)
    """torch CPU threads (1 suits a shared 2-core machine)"""
    speed: bool = False
    """codec speed and memory at 0.5B instead (locospeed.py)"""
    speed_model: Literal["qwen2-0.5b", "gpt"] = "qwen2-0.5b"
    """--speed: weights"""
    device: str = "cpu"
    """--speed: where the tensors live (cpu or cuda)"""
    repeat: int = Field(default=3, ge=1)
    """--speed: timing repeats; the fastest counts"""
    cache_dir: Path | None = None
    """--speed: where the 0.5B trace may be cached"""

    @field_validator("methods")
    @classmethod
    def _with_references(cls, methods: str | None) -> str | None:
        if methods is not None and not {"ddp", "diloco"} <= set(methods.split(",")) <= set(METHODS):
            raise ValueError(f"must include ddp and diloco (the references) and name only {','.join(METHODS)}")
        return methods

    @property
    def gpt(self) -> GPTConfig:
        return GPTConfig(n_layer=self.n_layer, n_embd=self.n_embd)

    def regimes(self) -> list[str]:
        """The regimes `--regime` names."""
        return list(REGIMES) if self.regime == "both" else [self.regime]

    def methods_of(self, regime: Regime) -> list[Method]:
        """`--methods`, else the regime's own."""
        return [METHODS[m] for m in (self.methods.split(",") if self.methods else regime.methods)]

    def inner_lr(self, regime: str) -> float:
        return self.finetune_lr if regime == "finetune" else REGIMES[regime].inner_lr


def run(options: Options) -> BenchResult:
    if options.speed:
        if options.device.startswith("cuda") and not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device here")
        torch.set_num_threads(options.threads)
        device = torch.device(options.device)
        gpt, seed, cache_dir = options.gpt, options.seed, options.cache_dir
        return run_speed(options.speed_model, device, options.repeat, gpt=gpt, seed=seed, cache_dir=cache_dir)
    torch.set_num_threads(options.threads)
    cfg = options.gpt
    corpus = stdlib_corpus()
    held = [
        corpus.batch(derive_seed("loco-eval", i), EVAL_BATCH_SIZE, cfg.block_size, "held_out")
        for i in range(EVAL_BATCHES)
    ]
    results: dict[str, dict[str, Outcome]] = {}
    starts: dict[str, float] = {}
    for name in options.regimes():
        regime = REGIMES[name]
        lr = options.inner_lr(name)
        base = load_or_train(cfg, corpus=corpus).model if regime.from_base else build_gpt(cfg, options.seed)
        setup = Setup(
            cfg=cfg,
            init={n: t.detach().clone().float() for n, t in unique_state(base).items()},
            corpus=corpus,
            inner=InnerOptimConfig(lr=lr, warmup_steps=regime.warmup_steps),
            replicas=options.replicas,
            rounds=options.rounds,
            steps=options.inner_steps,
            batch_size=options.batch_size,
            seed=derive_seed("loco", name, options.seed),
        )
        probe = build_gpt(cfg)
        load_bf16_state(probe, bf16_state(base))
        starts[name] = evaluate(probe, held)
        log.info(
            "loco %s: inner lr %g, %d x %d steps, %d replicas",
            name,
            lr,
            options.rounds,
            options.inner_steps,
            options.replicas,
        )
        results[name] = run_regime(setup, options.methods_of(regime), held)
    return _result(results, starts, options)


def _result(results: dict[str, dict[str, Outcome]], starts: dict[str, float], options: Options) -> BenchResult:
    summary = {
        regime: {
            m: {"final_loss": o.final_loss, "bytes_per_round": o.bytes_per_round, "bits_per_value": o.bits_per_value}
            for m, o in rows.items()
        }
        for regime, rows in results.items()
    }
    columns = ["method", "loss", "vs DiLoCo", "gain", "bytes/round", "/DiLoCo", "/DDP", "bits/val", "sent", "s"]
    tables = []
    for regime, rows in results.items():
        diloco, ddp, start = rows["diloco"], rows["ddp"], starts[regime]
        lines = [
            [
                name,
                f"{o.final_loss:.4f}",
                f"{100 * (o.final_loss / diloco.final_loss - 1):+.2f}%",
                _share_of_gain(start, o.final_loss, diloco.final_loss),
                f"{o.bytes_per_round:,.0f}",
                f"{diloco.bytes_per_round / o.bytes_per_round:.1f}x",
                f"{ddp.bytes_per_round / o.bytes_per_round:.1f}x",
                f"{o.bits_per_value:.2f}",
                f"{100 * o.density:.1f}%",
                f"{o.seconds:.0f}",
            ]
            for name, o in rows.items()
        ]
        lr = options.inner_lr(regime)
        title = (
            f"loco {regime}: lr {lr:g}, {options.replicas} replicas x {options.rounds} rounds "
            f"x H={options.inner_steps}, "
            f"start loss {start:.4f}; gain = loss drop / DiLoCo's"
        )
        tables.append(table(title, columns, lines))
    return BenchResult(summary=summary, tables=tables)


def _share_of_gain(start: float, loss: float, reference: float) -> str:
    """How much of the reference method's loss drop from `start` this one achieved."""
    return f"{100 * (start - loss) / (start - reference):.0f}%" if start != reference else "-"
