"""gauntlet: the validator against fake miners, in process: selection, loss, time and memory.

Two runs from the same fresh embedded GPT with the same seeds: honest miners plus adversaries
(each adversary plays a different attack every round, so every kind of `fakeminers.KINDS` is
met), and the honest miners alone. Both go through the same validator (validator/core.py) with
its state on disk. Reported: how many aggregated submissions were honest (precision), how many
honest submissions were aggregated (recall), both final held-out losses, and the seconds a
round costs the validator and an honest miner (training + compression).

Peak memory: for a round of 8 and of 32 honest submissions, a fresh subprocess opens a
validator state, reads the submissions from a file and runs the round; it reports its own peak
resident memory (VmHWM; `ru_maxrss` would include the parent's, see `peak_rss_mb`). Only the
compressed payloads grow with the number of miners.

With `--flood N`, a third run measures rounds under N fresh keys of valid noise (newcomerflood.py):
at `--flood-norm` times the honest norm, and with `--flood-cold` from the run's first round.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field, field_validator

from node.bench import newcomerflood
from node.bench.arena import Arena, RoundRecord
from node.bench.report import BenchResult, table
from node.events import peak_rss_mb, steps
from node.learn.data import stdlib_corpus
from node.learn.gpteval import GPTEvaluator, batch_source
from node.learn.model import GPTConfig, build_gpt
from node.learn.train import InnerOptimConfig, evaluate, load_bf16_state, unique_state
from node.run.trainer import MinerSpec
from node.swarm.fakeminers import KINDS, FakeRun, Miner, RoundView, Shapeshifter, identity_for
from protocol.codec import REGISTRY
from protocol.parsing import STRICT
from validator.config import GauntletConfig
from validator.core import Validator
from validator.intake import Submission

EVAL_BATCHES = 8
EVAL_BATCH_SIZE = 16
RSS_SIZES = (8, 32)
RSS_INNER_STEPS = 2  # memory does not depend on how long the miners trained
_NUMBER = re.compile(r"[-+]?\b\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_KEY = re.compile(r"\b[0-9a-f]{12,}\b")


@dataclass
class RunOutcome:
    records: list[RoundRecord]
    final_loss: float
    losses: list[float]  # held-out loss after each round
    miner_seconds: float  # mean per honest miner per round
    validator_seconds: float  # mean per round


class Options(BaseModel):
    """`pulse bench gauntlet`'s options."""

    model_config = STRICT

    honest: int = Field(default=8, ge=1)
    """honest miners"""
    adversaries: int = Field(default=4, ge=0)
    """adversarial miners"""
    kinds: str = ",".join(KINDS)
    """attacks the adversaries rotate through, comma-separated (default: every kind)"""
    rounds: int = Field(default=20, ge=1)
    """rounds per run"""
    inner_steps: int = Field(default=15, ge=1)
    """H AdamW steps per round"""
    batch_size: int = Field(default=8, ge=1)
    """sequences per inner step"""
    assignment_batches: int | None = Field(default=None, ge=1)
    """batches a miner cycles over per round (default: H, a fresh one per step)"""
    lr: float = Field(default=1e-3, gt=0, allow_inf_nan=False)
    """inner AdamW learning rate"""
    top_g: int = Field(default=8, ge=1)
    """submissions aggregated per round"""
    eval_batch_size: int = Field(default=4, ge=1)
    """sequences per validator batch (a prefix of a miner's batch)"""
    random_batches: int = Field(default=2, ge=1)
    """random batches R per round"""
    codec: str = "sparseloco"
    """pseudo-gradient codec of the run (sparseloco, pulseloco or dense)"""
    n_layer: int = Field(default=2, ge=1)
    """GPT blocks (small, so the runs fit 2 CPU cores)"""
    n_embd: int = Field(default=128, ge=1)
    """GPT channels"""
    seed: int = 0
    """seed of the weights, the miners' keys and the rounds"""
    threads: int = Field(default=1, ge=1)
    """torch CPU threads (1 suits a shared 2-core machine)"""
    skip_rss: bool = False
    """skip the peak-memory subprocesses"""
    flood: int = Field(default=0, ge=0, le=1024)
    """also measure a flood of valid noise: this many fresh keys a round beside the honest miners, once
    they are established, for 2 rounds (newcomerflood.py; 0: not measured)"""
    flood_norm: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """the flood's norm, as a multiple of the honest median (0.01: a whisper)"""
    flood_cold: bool = False
    """start the flood with the run, before anyone is established, for 8 rounds"""
    newcomer_evaluations: int | None = Field(default=None, ge=1, le=128)
    """newcomer payloads the validator examines a round at most (default: the validator's, 32; 128:
    every seat, as before the bound)"""

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, kinds: str) -> str:
        named = _names(kinds)
        if not named:
            raise ValueError(f"name at least one attack kind of {', '.join(KINDS)}")
        if unknown := sorted(set(named) - set(KINDS)):
            raise ValueError(f"unknown attack kinds {unknown}; known: {', '.join(KINDS)}")
        return kinds

    @field_validator("codec")
    @classmethod
    def _known_codec(cls, codec: str) -> str:
        if codec not in REGISTRY:
            raise ValueError(f"unknown codec {codec!r}; known: {', '.join(sorted(REGISTRY))}")
        return codec

    @property
    def attack_kinds(self) -> list[str]:
        """`--kinds`, split."""
        return _names(self.kinds)

    @property
    def batches(self) -> int:
        """Batches a miner cycles over per round: `--assignment-batches`, else H."""
        return self.assignment_batches or self.inner_steps


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def run(options: Options) -> BenchResult:
    torch.set_num_threads(options.threads)
    bench = Bench(options)
    mixed = bench.play(options.adversaries, options.attack_kinds)
    honest_only = bench.play(0, options.attack_kinds)
    rss = {} if options.skip_rss else {n: bench.peak_rss(n) for n in RSS_SIZES}
    flood = None
    if options.flood:
        with tempfile.TemporaryDirectory(prefix="pulse-gauntlet-flood-") as folder:
            flooded = bench.validator(Path(folder))
            flood = newcomerflood.measure(
                flooded,
                bench.honest(options.honest),
                bench.setup,
                options.flood,
                norm_share=options.flood_norm,
                cold=options.flood_cold,
            )
    return _result(options, bench, mixed, honest_only, rss, flood)


class Bench:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.gpt = GPTConfig(n_layer=options.n_layer, n_embd=options.n_embd)
        self.corpus = stdlib_corpus()
        self.run_id = hashlib.sha256(f"pulse-bench-gauntlet/{options.seed}".encode()).hexdigest()
        self.batch = batch_source(self.corpus, options.batch_size, self.gpt.block_size)
        spec = MinerSpec(
            run_id=self.run_id,
            codec=options.codec,
            inner=InnerOptimConfig(lr=options.lr, warmup_steps=20),
            steps=options.inner_steps,
            assignment_batches=options.batches,
        )
        self.setup = FakeRun(spec, self.gpt, self.batch)
        self.cfg = GauntletConfig(
            codec=options.codec,
            assignment_batches=options.batches,
            top_g=options.top_g,
            random_batches=options.random_batches,
        )
        if options.newcomer_evaluations is not None:
            self.cfg = self.cfg.model_copy(update={"newcomer_evaluations": options.newcomer_evaluations})
        # the validator's batches are prefixes of the miners' (Corpus.batch draws starts in order)
        self.eval_batch = batch_source(self.corpus, options.eval_batch_size, self.gpt.block_size)
        self.init = {n: t.detach().clone() for n, t in unique_state(build_gpt(self.gpt, options.seed)).items()}
        self.held = [
            self.corpus.batch(1_000_003 * (i + 1), EVAL_BATCH_SIZE, self.gpt.block_size, "held_out")
            for i in range(EVAL_BATCHES)
        ]
        self.identity = identity_for(f"validator/{options.seed}")

    def honest(self, n: int, label: str = "honest") -> list[Miner]:
        return [Miner(self.setup, identity_for(f"{label}/{self.options.seed}/{i}")) for i in range(n)]

    def play(self, adversaries: int, kinds: Sequence[str]) -> RunOutcome:
        honest = self.honest(self.options.honest)
        victims = [m.key for m in honest]
        bad = [
            Shapeshifter(self.setup, identity_for(f"adversary/{self.options.seed}/{j}"), kinds, j, victims)
            for j in range(adversaries)
        ]
        probe = build_gpt(self.gpt)
        with tempfile.TemporaryDirectory(prefix="pulse-gauntlet-") as folder:
            validator = self.validator(Path(folder))
            arena = Arena(validator, [*honest, *bad], seed=self.options.seed)
            losses = []
            for _ in steps(range(self.options.rounds), "gauntlet rounds"):
                record = arena.play()
                load_bf16_state(probe, record.weights)
                losses.append(evaluate(probe, self.held))
        seconds = [s for m in honest for s in m.seconds]
        return RunOutcome(
            records=arena.records,
            final_loss=losses[-1],
            losses=losses,
            miner_seconds=sum(seconds) / len(seconds),
            validator_seconds=sum(r.report.seconds for r in arena.records) / len(arena.records),
        )

    def validator(self, folder: Path) -> Validator:
        evaluator = GPTEvaluator(build_gpt(self.gpt))
        return Validator.create(folder, self.cfg, self.run_id, self.identity, self.init, evaluator, self.eval_batch)

    def peak_rss(self, miners: int) -> float:
        """Peak RSS (MiB) of a fresh process that runs one validator round of `miners` submissions."""
        with tempfile.TemporaryDirectory(prefix="pulse-gauntlet-rss-") as tmp:
            folder = Path(tmp)
            v = self.validator(folder / "state")
            setup = replace(self.setup, spec=replace(self.setup.spec, steps=RSS_INNER_STEPS))
            view = RoundView(v.round, v.weights, v.state_hash, None)
            subs = [Miner(setup, identity_for(f"rss/{self.options.seed}/{i}")).submit(view) for i in range(miners)]
            write_submissions(folder / "submissions.bin", [s for s in subs if s is not None])
            job = {
                "state": str(folder / "state"),
                "submissions": str(folder / "submissions.bin"),
                "gpt": self.gpt.model_dump(),
                "cfg": self.cfg.model_dump_json(),
                "run_id": self.run_id,
                "validator_seed": f"validator/{self.options.seed}",
                "batch_size": self.options.eval_batch_size,
                "threads": self.options.threads,
            }
            (folder / "job.json").write_text(json.dumps(job))
            code = "import sys; from node.bench.gauntlet import rss_child; rss_child(sys.argv[1])"
            out = subprocess.run(
                [sys.executable, "-c", code, str(folder / "job.json")], capture_output=True, text=True, check=True
            )
            return float(json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"])


def write_submissions(path: Path, subs: Sequence[Submission]) -> None:
    """u32 count, then per submission: u32 envelope length, envelope, u64 payload length, payload."""
    with path.open("wb") as f:
        f.write(struct.pack("<I", len(subs)))
        for s in subs:
            payload = s.read()
            f.write(struct.pack("<I", len(s.envelope)) + s.envelope + struct.pack("<Q", len(payload)) + payload)


def read_submissions(path: Path) -> list[Submission]:
    data = memoryview(path.read_bytes())
    (count,), pos, subs = struct.unpack_from("<I", data), 4, []
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, pos)
        envelope, pos = bytes(data[pos + 4 : pos + 4 + n]), pos + 4 + n
        (m,) = struct.unpack_from("<Q", data, pos)
        payload, pos = bytes(data[pos + 8 : pos + 8 + m]), pos + 8 + m
        subs.append(Submission(envelope, payload))
    return subs


def rss_child(job_path: str) -> None:
    """Subprocess entry: run one validator round from files and print its peak RSS as JSON."""
    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(job["threads"])
    gpt = GPTConfig(**job["gpt"])
    corpus = stdlib_corpus()
    identity = identity_for(job["validator_seed"])
    validator = Validator.open(
        Path(job["state"]),
        GauntletConfig.model_validate_json(job["cfg"]),
        job["run_id"],
        identity,
        GPTEvaluator(build_gpt(gpt)),
        batch_source(corpus, job["batch_size"], gpt.block_size),
    )
    report = validator.run_round(read_submissions(Path(job["submissions"])))
    print(json.dumps({"peak_rss_mb": peak_rss_mb(), "submissions": len(report.outcomes)}))


def _counts(run: RunOutcome) -> tuple[int, int, int, Counter[str], Counter[str]]:
    selected = honest_selected = honest_sent = 0
    by_kind: Counter[str] = Counter()
    picked: Counter[str] = Counter()
    for rec in run.records:
        kinds = rec.selected_kinds()
        selected += len(kinds)
        honest_selected += kinds.count("honest")
        honest_sent += rec.kinds.count("honest")
        by_kind.update(rec.kinds)
        picked.update(kinds)
    return selected, honest_selected, honest_sent, by_kind, picked


def _indicator_rates(run: RunOutcome) -> dict[str, float]:
    """Per kind, the fraction of evaluated submissions whose indicator was +1."""
    plus: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    for rec in run.records:
        for o in rec.report.outcomes:
            if o.gains is not None:
                seen[rec.kinds[o.index]] += 1
                plus[rec.kinds[o.index]] += o.indicator > 0
    return {k: plus[k] / n for k, n in sorted(seen.items())}


def _reasons(run: RunOutcome) -> dict[str, str]:
    """The most common reason each kind was not aggregated."""
    reasons: dict[str, Counter[str]] = {}
    for rec in run.records:
        for o in rec.report.outcomes:
            if o.status != "selected":
                text = re.sub(_NUMBER, "N", re.sub(_KEY, "<key>", o.reason))
                reasons.setdefault(rec.kinds[o.index], Counter())[text[:44]] += 1
    return {k: c.most_common(1)[0][0] for k, c in reasons.items()}


def _result(
    options: Options,
    bench: Bench,
    mixed: RunOutcome,
    honest_only: RunOutcome,
    rss: dict[int, float],
    flood: newcomerflood.FloodOutcome | None = None,
) -> BenchResult:
    selected, honest_selected, honest_sent, by_kind, picked = _counts(mixed)
    summary: dict[str, Any] = {
        "selection_precision": honest_selected / selected if selected else None,
        "honest_recall": honest_selected / honest_sent if honest_sent else None,
        "final_loss": mixed.final_loss,
        "honest_only_final_loss": honest_only.final_loss,
        "validator_seconds_per_round": mixed.validator_seconds,
        "miner_seconds_per_round": mixed.miner_seconds,
        "honest_only_validator_seconds_per_round": honest_only.validator_seconds,
        "adversarial_selected": selected - honest_selected,
        "settings": {
            "honest": options.honest,
            "adversaries": options.adversaries,
            "rounds": options.rounds,
            "inner_steps": options.inner_steps,
            "batch_size": options.batch_size,
            "assignment_batches": options.batches,
            "top_g": options.top_g,
            "eval_batch_size": options.eval_batch_size,
            "random_batches": options.random_batches,
            "codec": options.codec,
            "n_layer": options.n_layer,
            "n_embd": options.n_embd,
            "threads": options.threads,
            "newcomer_evaluations": bench.cfg.newcomer_evaluations,
        },
    }
    for n, mb in rss.items():
        summary[f"peak_rss_mb_{n}"] = mb
    summary["indicator_plus_rate"] = _indicator_rates(mixed)
    reasons = _reasons(mixed)
    kind_rows = [[k, by_kind[k], picked[k], reasons.get(k, "")] for k in sorted(by_kind, key=lambda k: k != "honest")]
    every = max(1, options.rounds // 10)
    loss_rows = [
        [r + 1, mixed.losses[r], honest_only.losses[r], len(mixed.records[r].selected_kinds())]
        for r in range(options.rounds)
        if (r + 1) % every == 0 or r == 0
    ]
    gap = 100 * (mixed.final_loss / honest_only.final_loss - 1)
    headline = [
        ["selection precision", summary["selection_precision"], "1.0"],
        ["honest recall", summary["honest_recall"], ""],
        ["final loss (vs honest only)", f"{mixed.final_loss:.4f} ({gap:+.2f}%)", "within 2%"],
        ["validator s/round", mixed.validator_seconds, f"< miner {mixed.miner_seconds:.2f}"],
    ]
    if rss:
        headline.append(["peak RSS MiB, 8 / 32 miners", f"{rss[8]:.0f} / {rss[32]:.0f}", "32 <= 1.2 x 8"])
    if flood is not None:
        summary |= flood.summary()
    tables = [
        table("gauntlet: headline", ["figure", "value", "target"], headline),
        table("gauntlet: submissions by kind", ["kind", "sent", "aggregated", "usual reason otherwise"], kind_rows),
        table("gauntlet: held-out loss", ["round", "with adversaries", "honest only", "aggregated"], loss_rows),
    ]
    if flood is not None:
        rows = [] if flood.cold else [["before the flood", flood.quiet_seconds, flood.quiet_honest, 0, 0]]
        rows += [
            [f"flooded round {i + 1}", sec, n, theirs, left]
            for i, (sec, n, theirs, left) in enumerate(
                zip(flood.seconds, flood.honest, flood.flood, flood.unexamined, strict=True)
            )
        ]
        when = "from round 0" if flood.cold else "once the honest miners are established"
        title = (
            f"gauntlet: {flood.keys} fresh keys of valid noise at {flood.norm_share:g}x the honest norm a round,"
            f" {when} ({bench.cfg.newcomer_evaluations} examined)"
        )
        columns = ["round", "validator s", "honest aggregated", "flood aggregated", "unexamined"]
        tables.append(table(title, columns, rows))
    return BenchResult(summary=summary, tables=tables)
