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
"""

from __future__ import annotations

import argparse
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

from node.bench.arena import Arena, RoundRecord
from node.bench.report import BenchResult, table
from node.events import peak_rss_mb, steps
from node.learn.data import stdlib_corpus
from node.learn.gpteval import GPTEvaluator, batch_source
from node.learn.model import GPTConfig, build_gpt
from node.learn.train import InnerOptimConfig, evaluate, load_bf16_state, unique_state
from node.run.trainer import MinerSpec
from node.swarm.fakeminers import KINDS, FakeRun, Miner, RoundView, Shapeshifter, identity_for
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


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--honest", type=int, default=8, help="honest miners")
    parser.add_argument("--adversaries", type=int, default=4, help="adversarial miners")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"attacks the adversaries rotate through ({KINDS})")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--inner-steps", type=int, default=15, help="H AdamW steps per round")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per inner step")
    parser.add_argument(
        "--assignment-batches",
        type=int,
        default=None,
        help="batches a miner cycles over per round (default: H, a fresh one per step)",
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="inner AdamW learning rate")
    parser.add_argument("--top-g", type=int, default=8, help="submissions aggregated per round")
    parser.add_argument(
        "--eval-batch-size", type=int, default=4, help="sequences per validator batch (a prefix of a miner's batch)"
    )
    parser.add_argument("--random-batches", type=int, default=2, help="random batches R per round")
    parser.add_argument("--codec", default="sparseloco")
    parser.add_argument("--n-layer", type=int, default=2, help="GPT blocks (small, so the runs fit 2 CPU cores)")
    parser.add_argument("--n-embd", type=int, default=128, help="GPT channels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 suits a shared 2-core machine)")
    parser.add_argument("--skip-rss", action="store_true", help="skip the peak-memory subprocesses")


def run(args: argparse.Namespace) -> BenchResult:
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if unknown := sorted(set(kinds) - set(KINDS)):
        raise SystemExit(f"unknown attack kinds {unknown}; known: {KINDS}")
    if min(args.honest, args.rounds, args.inner_steps, args.batch_size) < 1 or not kinds:
        raise SystemExit("--honest, --rounds, --inner-steps, --batch-size and --kinds must be non-empty")
    torch.set_num_threads(args.threads)
    args.assignment_batches = args.assignment_batches or args.inner_steps
    bench = Bench(args)
    mixed = bench.play(args.adversaries, kinds)
    honest_only = bench.play(0, kinds)
    rss = {} if args.skip_rss else {n: bench.peak_rss(n) for n in RSS_SIZES}
    return _result(args, bench, mixed, honest_only, rss)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.gpt = GPTConfig(n_layer=args.n_layer, n_embd=args.n_embd)
        self.corpus = stdlib_corpus()
        self.run_id = hashlib.sha256(f"pulse-bench-gauntlet/{args.seed}".encode()).hexdigest()
        self.batch = batch_source(self.corpus, args.batch_size, self.gpt.block_size)
        spec = MinerSpec(
            run_id=self.run_id,
            codec=args.codec,
            inner=InnerOptimConfig(lr=args.lr, warmup_steps=20),
            steps=args.inner_steps,
            assignment_batches=args.assignment_batches,
        )
        self.setup = FakeRun(spec, self.gpt, self.batch)
        self.cfg = GauntletConfig(
            codec=args.codec,
            assignment_batches=args.assignment_batches,
            top_g=args.top_g,
            random_batches=args.random_batches,
        )
        # the validator's batches are prefixes of the miners' (Corpus.batch draws starts in order)
        self.eval_batch = batch_source(self.corpus, args.eval_batch_size, self.gpt.block_size)
        self.init = {n: t.detach().clone() for n, t in unique_state(build_gpt(self.gpt, args.seed)).items()}
        self.held = [
            self.corpus.batch(1_000_003 * (i + 1), EVAL_BATCH_SIZE, self.gpt.block_size, "held_out")
            for i in range(EVAL_BATCHES)
        ]
        self.identity = identity_for(f"validator/{args.seed}")

    def honest(self, n: int, label: str = "honest") -> list[Miner]:
        return [Miner(self.setup, identity_for(f"{label}/{self.args.seed}/{i}")) for i in range(n)]

    def play(self, adversaries: int, kinds: Sequence[str]) -> RunOutcome:
        honest = self.honest(self.args.honest)
        victims = [m.key for m in honest]
        bad = [
            Shapeshifter(self.setup, identity_for(f"adversary/{self.args.seed}/{j}"), kinds, j, victims)
            for j in range(adversaries)
        ]
        probe = build_gpt(self.gpt)
        with tempfile.TemporaryDirectory(prefix="pulse-gauntlet-") as folder:
            validator = self.validator(Path(folder))
            arena = Arena(validator, [*honest, *bad], seed=self.args.seed)
            losses = []
            for _ in steps(range(self.args.rounds), "gauntlet rounds"):
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
            subs = [Miner(setup, identity_for(f"rss/{self.args.seed}/{i}")).submit(view) for i in range(miners)]
            write_submissions(folder / "submissions.bin", [s for s in subs if s is not None])
            job = {
                "state": str(folder / "state"),
                "submissions": str(folder / "submissions.bin"),
                "gpt": self.gpt.model_dump(),
                "cfg": self.cfg.model_dump_json(),
                "run_id": self.run_id,
                "validator_seed": f"validator/{self.args.seed}",
                "batch_size": self.args.eval_batch_size,
                "threads": self.args.threads,
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
    args: argparse.Namespace, bench: Bench, mixed: RunOutcome, honest_only: RunOutcome, rss: dict[int, float]
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
            "honest": args.honest,
            "adversaries": args.adversaries,
            "rounds": args.rounds,
            "inner_steps": args.inner_steps,
            "batch_size": args.batch_size,
            "assignment_batches": args.assignment_batches,
            "top_g": args.top_g,
            "eval_batch_size": args.eval_batch_size,
            "random_batches": args.random_batches,
            "codec": args.codec,
            "n_layer": args.n_layer,
            "n_embd": args.n_embd,
            "threads": args.threads,
        },
    }
    for n, mb in rss.items():
        summary[f"peak_rss_mb_{n}"] = mb
    summary["indicator_plus_rate"] = _indicator_rates(mixed)
    reasons = _reasons(mixed)
    kind_rows = [[k, by_kind[k], picked[k], reasons.get(k, "")] for k in sorted(by_kind, key=lambda k: k != "honest")]
    every = max(1, args.rounds // 10)
    loss_rows = [
        [r + 1, mixed.losses[r], honest_only.losses[r], len(mixed.records[r].selected_kinds())]
        for r in range(args.rounds)
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
    tables = [
        table("gauntlet: headline", ["figure", "value", "target"], headline),
        table("gauntlet: submissions by kind", ["kind", "sent", "aggregated", "usual reason otherwise"], kind_rows),
        table("gauntlet: held-out loss", ["round", "with adversaries", "honest only", "aggregated"], loss_rows),
    ]
    return BenchResult(summary=summary, tables=tables)
