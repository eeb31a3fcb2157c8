"""A tiny in-process swarm for validator tests: a 1-block GPT, ~300 KB of corpus, fake miners.

The miners are `node.swarm.fakeminers`' (the benchmark uses the same ones); this module only
picks settings small enough for 2 shared CPU cores and builds validators on them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from node.learn.data import Corpus, stdlib_root
from node.learn.gpteval import GPTEvaluator, batch_source
from node.learn.model import GPTConfig, build_gpt
from node.learn.train import Batch, InnerOptimConfig, evaluate, load_bf16_state, unique_state
from node.run.trainer import MinerSpec
from node.swarm.fakeminers import KINDS, FakeRun, Miner, identity_for, make_adversary
from protocol.state import State
from validator.config import GauntletConfig
from validator.core import Validator
from validator.scoring import Evaluator
from validator.state import CrashHook

TINY = GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=64)
RUN_ID = hashlib.sha256(b"pulse-test-gauntlet").hexdigest()
SOURCES = ["argparse.py", "collections/__init__.py", "functools.py", "json/decoder.py", "pathlib.py", "typing.py"]


@cache
def small_corpus() -> Corpus:
    """~300 KB of real Python source; the last tenth held out."""
    text = b"".join((stdlib_root() / n).read_bytes()[:60_000] for n in SOURCES if (stdlib_root() / n).exists())
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    cut = len(tokens) * 9 // 10
    return Corpus(train=tokens[:cut].clone(), held_out=tokens[cut:].clone())


@dataclass(frozen=True)
class Swarm:
    setup: FakeRun
    cfg: GauntletConfig
    init: dict[str, torch.Tensor]
    held: list[Batch]

    def validator(self, folder: Path, crash_hook: CrashHook | None = None) -> Validator:
        return Validator.create(
            folder, self.cfg, self.setup.spec.run_id, identity_for("validator"), self.init, self.evaluator(),
            self.setup.batch, crash_hook=crash_hook,
        )  # fmt: skip

    def reopen(self, folder: Path, crash_hook: CrashHook | None = None) -> Validator:
        return Validator.open(
            folder, self.cfg, self.setup.spec.run_id, identity_for("validator"), self.evaluator(), self.setup.batch,
            crash_hook=crash_hook,
        )  # fmt: skip

    def evaluator(self) -> GPTEvaluator:
        return GPTEvaluator(build_gpt(self.setup.gpt))

    def honest(self, n: int) -> list[Miner]:
        return [Miner(self.setup, identity_for(f"test-honest/{i}")) for i in range(n)]

    def adversaries(self, kinds: tuple[str, ...], victims: list[str]) -> list[Miner]:
        return [make_adversary(k, self.setup, identity_for(f"test-{k}"), victims) for k in kinds]

    def held_out_loss(self, weights: dict[str, torch.Tensor]) -> float:
        probe = build_gpt(self.setup.gpt)
        load_bf16_state(probe, weights)
        return evaluate(probe, self.held)


def make_swarm(run_id: str = RUN_ID, **cfg: object) -> Swarm:
    """`run_id`: the run the validator and miners sign for (a manifest's, to export the run)."""
    torch.set_num_threads(1)
    corpus = small_corpus()
    spec = MinerSpec(
        run_id=run_id,
        codec="sparseloco",
        inner=InnerOptimConfig(lr=3e-3, warmup_steps=5),
        steps=6,
        assignment_batches=1,
    )
    setup = FakeRun(spec, TINY, batch_source(corpus, 8, TINY.block_size))
    init = {n: t.detach().clone() for n, t in unique_state(build_gpt(TINY, seed=0)).items()}
    held = [corpus.batch(10_000 + i, 16, TINY.block_size, "held_out") for i in range(4)]
    return Swarm(setup, GauntletConfig(assignment_batches=1, **cfg), init, held)  # type: ignore[arg-type]


__all__ = ["KINDS", "Swarm", "make_swarm", "small_corpus"]


class CountingEvaluator:
    """A validator's evaluator, counting what it is asked: `evaluations` (updates loaded: one per
    evaluated update, one per reference) and `losses` (forward passes)."""

    def __init__(self, inner: Evaluator) -> None:
        self.inner, self.evaluations, self.losses = inner, 0, 0
        self.device = getattr(inner, "device", "cpu")

    def load(self, base: State, update: State | None = None, step: float = 0.0) -> None:
        self.evaluations += update is not None
        self.inner.load(base, update, step)

    def loss(self, batch: Batch) -> float:
        self.losses += 1
        return self.inner.loss(batch)
