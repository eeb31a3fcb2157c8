"""scale: Qwen2.5-0.5B's architecture through whole rounds: each role's seconds and memory, and a projection.

One process, the real pieces, one role at a time: W_0 from the seeded architecture and a
`validator.core.Validator` created on disk; miners (`node.run.trainer.Trainer`: H inner steps on
their assignments with the manifest's memory options, the codec's compress with error
feedback); validator rounds of 4, 8 and 16 submissions (`Validator.run_round`: intake, decode,
Gauntlet evaluation, aggregation, outer step, PULSESync encode, commit), each from the same
committed state; a follower applying the patch and checking the state hash. The settings are
those of the home-GPU preset (`configs/qwen2.5-0.5b-home-gpu.toml`: memory options, codec,
learning rates, top G) with seeded weights and the embedded corpus in byte ids.

Where the run is smaller than the preset (a CPU cannot train 30 steps of 4 x 1024 tokens of a
0.5B model in minutes) the round times are scaled, and the output says so: two forward+backward
probes on the first miner and two forward probes on the validator's model fit seconds = a + b x
tokens; the optimizer step is timed once; a miner's preset round = fixed work + H x (step at the
preset's tokens); the validator's = its measured round with each forward pass re-timed at the
preset's evaluation batch. A round that holds more submissions than there are trained miners
fills up with exact copies re-signed by other keys (as a copycat sends them): they cost the
validator the same intake and evaluation, but their payload is decoded only with its original
(each distinct payload is decoded once a round, then read back from the validator's spill) and
they are not aggregated, so the round of 8 is corrected by one measured decode per copy.

Memory: per phase, the process's resident peak (and CUDA's allocated peak), see `phases.py`;
a role's own memory is its peak minus what was resident when it started. What a miner holds is
also counted tensor by tensor (`footprint.py`), which is what the projection to 1.5B, 7B and 72B
parameters scales. On CUDA, `--measure-1-5b` trains the 1.5B architecture itself with the
preset's settings and reads the allocator's peak. A miner's host at compress is measured in a
steady round (it holds a buffer from an earlier round) and projected with the `train.memory` of
the size's own preset where there is one (`configs/qwen2.5-1.5b-home-gpu.toml` for 1.5B): the BF16
weights, the buffer and the pseudo-gradient as that preset stores them, plus the codec's measured
peak above them per parameter; the projection says which preset's settings it used.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field, field_validator, model_validator

import validator.core as validator_core
from node.bench.footprint import MinerState, StepProbe, miner_state, probe_step, storage_bytes
from node.bench.phases import MB, PhaseRecorder, release_memory, timed_methods
from node.bench.report import BenchResult
from node.learn.gpteval import GPTEvaluator
from node.learn.train import Batch, autocast, bf16_state
from node.run.hostmemory import return_large_frees
from node.run.manifest import Manifest, load_manifest, parse_manifest
from node.run.presets import preset
from node.run.setup import RunSetup
from node.run.task import LMTask
from node.run.trainer import LMTrainer
from node.swarm.fakeminers import identity_for
from protocol import pulsesync
from protocol.assignment import Assignment
from protocol.codec import zeros_like
from protocol.messages import SubmissionHeader
from protocol.parsing import STRICT
from protocol.signing import SignedMessage, sign
from protocol.statehash import state_hash
from validator.core import RoundReport, Validator
from validator.gauntlet import RoundPipeline, Standing
from validator.intake import Submission, payload_size
from validator.ratings import RatingRecord, Ratings
from validator.spill import DecodedSpill

log = logging.getLogger(__name__)
HOME_PRESET = "qwen2.5-0.5b-home-gpu"
CPU_DEFAULTS = {"steps": 2, "batch_size": 1, "seq_len": 32, "eval_batch_size": 1}  # a CPU run; scaled to the preset
PROBE_TOKENS = 512  # the second calibration point: one sequence of 512 tokens


Architecture = Literal["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-72b"]
"""The seeded architectures a run can build: `hfmodel.ARCHITECTURES`' names."""


class Options(BaseModel):
    """`pulse bench scale`'s options: where it runs, the preset measured and the run's sizes (a size
    left out is the CPU's small one on cpu, the preset's on cuda)."""

    model_config = STRICT

    device: Literal["cpu", "cuda"] = "cpu"
    """where miners train and the validator evaluates"""
    config: Path | None = None
    """preset measured (default configs/qwen2.5-0.5b-home-gpu.toml)"""
    architecture: Architecture = "qwen2.5-0.5b"
    """model built (seeded)"""
    model_dir: Path | None = None
    """build the config.json in this folder instead"""
    miners: int = Field(default=4, ge=1)
    """miners that train"""
    steps: int | None = Field(default=None, ge=1)
    """inner steps a miner runs (cpu 2; cuda: the preset's H)"""
    batch_size: int | None = Field(default=None, ge=1)
    """sequences per inner step (cpu 1; cuda: the preset's)"""
    seq_len: int | None = Field(default=None, ge=1)
    """tokens per sequence (cpu 32; cuda: the preset's)"""
    eval_batch_size: int | None = Field(default=None, ge=1)
    """validator batch (cpu 1; cuda: the preset's)"""
    submissions: str | None = None
    """validator rounds, comma-separated sizes (cpu 4,16; cuda 4,8,16)"""
    measure_1_5b: bool = False
    """also train the 1.5B architecture (needs ~24 GB)"""
    threads: int = Field(default=0, ge=0)
    """torch CPU threads, 0 for torch's default"""
    budget_seconds: float = Field(default=0.0, ge=0)
    """seconds after which the validator rounds past the first are skipped, 0 for no limit"""

    @field_validator("submissions")
    @classmethod
    def _sizes_are_counts(cls, text: str | None) -> str | None:
        if text is not None:
            _sizes(text)
        return text

    @model_validator(mode="after")
    def _eval_batch_fits(self) -> Options:
        batch, evb = self.batch_size, self.eval_batch_size
        if self.device == "cpu":  # on cuda a size left out is the preset's: `settings` checks those
            batch, evb = batch or CPU_DEFAULTS["batch_size"], evb or CPU_DEFAULTS["eval_batch_size"]
        if batch is not None and evb is not None and evb > batch:
            raise ValueError(f"--eval-batch-size ({evb}) must be <= --batch-size ({batch})")
        return self

    @property
    def sizes(self) -> tuple[int, ...]:
        """The validator rounds' sizes (`--submissions`, or the device's default)."""
        return _sizes(self.submissions or ("4,16" if self.device == "cpu" else "4,8,16"))


def _sizes(text: str) -> tuple[int, ...]:
    """`--submissions`' comma-separated sizes; ValueError unless each is a whole number >= 1."""
    words = text.split(",")
    if not all(w.strip().isdigit() and int(w) >= 1 for w in words):
        raise ValueError(f"{text!r} is not comma-separated sizes >= 1 (e.g. 4,8,16)")
    return tuple(int(w) for w in words)


@dataclass(frozen=True)
class Settings:
    device: torch.device
    preset: Manifest  # what is measured
    run: Manifest  # what runs: the preset at the run's sizes, seeded, embedded corpus
    miners: int
    sizes: tuple[int, ...]
    measure_1_5b: bool

    @property
    def scaled(self) -> bool:
        p, r = self.preset, self.run
        return (p.train.inner_steps, p.data.batch_size, p.data.seq_len, p.selection.eval_batch_size) != (
            r.train.inner_steps,
            r.data.batch_size,
            r.data.seq_len,
            r.selection.eval_batch_size,
        )


def settings(options: Options) -> Settings:
    device = torch.device(options.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pulse bench scale: --device cuda, but this torch build sees no CUDA device")
    home = load_manifest(options.config or preset(HOME_PRESET))
    cpu = device.type == "cpu"

    def pick(value: int | None, key: str, preset_value: int) -> int:
        return value if value is not None else (int(CPU_DEFAULTS[key]) if cpu else preset_value)

    steps = pick(options.steps, "steps", home.train.inner_steps)
    batch = pick(options.batch_size, "batch_size", home.data.batch_size)
    seq = pick(options.seq_len, "seq_len", home.data.seq_len)
    evb = pick(options.eval_batch_size, "eval_batch_size", home.selection.eval_batch_size)
    if evb > batch:  # one of them is the preset's (the options check the sizes they give)
        raise SystemExit(f"pulse bench scale: --eval-batch-size ({evb}) must be <= --batch-size ({batch})")
    model: dict[str, str] = {"architecture": options.architecture}
    if options.model_dir:
        model = {"path": str(options.model_dir)}
    run = run_manifest(home, model, steps, batch, seq, evb)
    return Settings(device, home, run, options.miners, options.sizes, options.measure_1_5b)


def run_manifest(home: Manifest, model: dict[str, str], steps: int, batch: int, seq: int, eval_batch: int) -> Manifest:
    """The preset with a seeded architecture (`model`: its `architecture` or `path`), the embedded corpus
    and the run's sizes.

    The indicator threshold is 0 so that a first round can aggregate (an average starts at 0).
    """
    data = home.model_dump(mode="python")
    data["validators"] = [identity_for("scale/validator").public_hex]
    data["model"].update({"kind": "hf", "init": "seeded", "architecture": None, "path": None, "seed": 0, **model})
    data["data"] = {"kind": "embedded", "cap_bytes": 4 * 2**20, "batch_size": batch, "seq_len": seq}
    data["train"]["inner_steps"] = steps
    data["selection"].update(eval_batch_size=eval_batch, min_indicator_average=0.0, held_out_batches=0)
    # the preset's fresh batch per step, as far as these steps go (a manifest refuses more)
    data["selection"]["assignment_batches"] = min(data["selection"]["assignment_batches"], steps)
    return parse_manifest(data, "pulse bench scale")


class SteadyValidator(Validator):
    """The `Validator`, with one thing set for the benchmark: its round starts from a steady state in
    which every key of `veterans` has an indicator average of 1 and a settled rating (OpenSkill mu 30,
    sigma 1), as established miners have after some honest rounds. A first round would aggregate
    nothing (indicator averages start at 0), and what a round costs depends on what it aggregates."""

    veterans: tuple[str, ...] = ()
    copiers: tuple[str, ...] = ()
    """Veterans whose record is half the others': the copies' senders. Under equal records no
    member of a copy group owns it and all are rejected (`copy_owners`), so nothing would be
    aggregated; with the authors leading on record, their updates are, as in a run."""

    def standing(self) -> Standing:
        cfg = self.cfg
        settled = {k: RatingRecord(mu=30.0, sigma=1.0, last_round=self.round) for k in self.veterans}
        ratings = Ratings(cfg.openskill_beta, cfg.openskill_tau, cfg.missing_rounds, settled)
        indicators = {k: 0.5 if k in self.copiers else 1.0 for k in self.veterans}
        return Standing(ratings, indicators)


@dataclass
class MinerRecord:
    submission: Submission
    loss: float
    payload_bytes: int
    state: MinerState
    delta_bytes: int


@dataclass
class RoundRecord:
    size: int
    copies: int
    report: RoundReport
    input_bytes: int
    start_mb: float  # resident before the validator opened its state
    peak_mb: float
    device_peak_mb: float
    seconds: float
    steps: dict[str, tuple[int, float]]  # step -> (calls, seconds) in this round

    def step_calls(self, step: str) -> int:
        return self.steps.get(step, (0, 0.0))[0]

    def step_seconds(self, step: str) -> float:
        return self.steps.get(step, (0, 0.0))[1]


@dataclass
class Calibration:
    """seconds = a + b x tokens, fitted on two probes; and the optimizer step alone."""

    train: tuple[StepProbe, StepProbe]
    optimizer_seconds: float
    eval_points: tuple[tuple[int, float], tuple[int, float]]
    full_activation: StepProbe | None  # without checkpointing (what one recomputed block costs)

    def train_seconds(self, tokens: int) -> float:
        return _line([(p.tokens, p.seconds) for p in self.train], tokens)

    def eval_seconds(self, tokens: int) -> float:
        return _line(list(self.eval_points), tokens)


def _line(points: list[tuple[int, float]], tokens: int) -> float:
    """seconds at `tokens` on the line through two (tokens, seconds) points, from the larger one; a
    busy machine can time the smaller point slower than the larger one, so the slope is at least 0."""
    (t0, s0), (t1, s1) = sorted(points)
    return s1 + max((s1 - s0) / (t1 - t0), 0.0) * (tokens - t1)


@dataclass
class Bench:
    s: Settings
    rec: PhaseRecorder
    folder: Path
    setup: RunSetup = field(init=False)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    base_hash: str = ""
    miners: list[MinerRecord] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    calibration: Calibration | None = None
    follower_ok: bool = False
    measured_1_5b: dict[str, float] | None = None
    skipped: list[int] = field(default_factory=list)  # validator rounds left out for the time budget

    def __post_init__(self) -> None:
        self.setup = RunSetup.from_manifest(self.s.run)
        self.task = LMTask(self.setup)
        self.identity = identity_for("scale/validator")

    def evaluator(self) -> GPTEvaluator:
        return self.task.evaluator(str(self.s.device))

    def create_w0(self) -> None:
        log.info("building W_0 (%s) and the validator's state", self.s.run.model.architecture or self.s.run.model.path)
        with self.rec.phase("validator.create"):
            master = self.task.initial_master()
            v = Validator.create(
                self.folder / "state", self.s.run.gauntlet(), self.setup.run_id, self.identity, master,
                self.evaluator(), self.setup.eval_batch,
            )  # fmt: skip
            self.weights, self.base_hash = v.weights, v.state_hash
            del master, v
        release_memory()

    def train_miners(self) -> None:
        for i in range(self.s.miners):
            self.miners.append(self.train_one(i, calibrate=i == 0))
            release_memory()
            stats = self.rec.stats
            log.info(
                "miner %d: trained %.1f s, compressed %.1f s to %d bytes; peak %.0f MB",
                i, stats["miner.train"].seconds / (i + 1), stats["miner.compress"].seconds / (i + 1),
                self.miners[-1].payload_bytes, stats["miner"].host_peak_mb,
            )  # fmt: skip

    def train_one(self, i: int, calibrate: bool) -> MinerRecord:
        ident = identity_for(f"scale/miner/{i}")
        with self.rec.phase("miner"):
            with self.rec.phase("miner.build"):
                trainer = self.task.trainer(ident, str(self.s.device))
                # the buffer a miner holds from its second round on, stored as train.memory says (zeros:
                # the payload of a first round), so that compress is measured in its steady state: the
                # old buffer consumed while the new one fills, not a new one on top of nothing
                trainer.error = zeros_like(self.weights, self.s.run.train.memory.error_dtype)
            with self.rec.phase("miner.train"):
                delta = trainer.train(0, self.weights)
            delta_bytes = storage_bytes(delta.values())
            with self.rec.phase("miner.compress"):  # handed over, as a miner does: freed tensor by tensor
                header, payload = trainer.package(0, delta, self.weights, self.base_hash, handover=True)
        record = MinerRecord(
            Submission(sign(ident, header).to_bytes(), payload), trainer.last_loss, len(payload),
            miner_state(trainer), delta_bytes,
        )  # fmt: skip
        if calibrate:
            del delta
            self.calibration = self.calibrate(trainer)
        return record

    def calibrate(self, trainer: LMTrainer) -> Calibration:
        """Probes on a miner that has finished its round (its weights may change: it trains no more)."""
        memory = self.s.run.train.memory
        ctx = lambda: autocast(trainer.device, trainer.autocast, memory)  # noqa: E731
        small, large = self.setup.batch(1), self.setup.corpus.batch(2, 1, PROBE_TOKENS)
        with self.rec.phase("miner.probe"):
            probes = (probe_step(trainer.model, small, ctx()), probe_step(trainer.model, large, ctx()))
            full = None
            if memory.checkpointing:
                trainer.model.set_checkpointing(False)
                full = probe_step(trainer.model, small, ctx())
                trainer.model.set_checkpointing(True)
            with ctx():
                trainer.model.loss(small[0].to(trainer.device), small[1].to(trainer.device)).backward()
        with self.rec.phase("miner.optimizer_step"):
            trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        evaluator = GPTEvaluator(trainer.model)
        evaluator.load(self.weights)
        points = (self.time_forward(evaluator, self.setup.eval_batch(3)), self.time_forward(evaluator, large))
        return Calibration(probes, self.rec.seconds("miner.optimizer_step"), points, full)

    def time_forward(self, evaluator: GPTEvaluator, batch: Batch, repeats: int = 2) -> tuple[int, float]:
        """(tokens, the fastest of `repeats` forward passes on `batch`): the first pays one-time costs."""
        best = float("inf")
        with self.rec.phase("validator.probe"):
            for _ in range(repeats):
                start = time.perf_counter()
                evaluator.loss(batch)  # a float: the device has finished
                best = min(best, time.perf_counter() - start)
        return batch[0].numel(), best

    def submissions(self, size: int) -> tuple[list[Submission], int]:
        """`size` submissions: the trained miners' first, then exact copies re-signed by other keys."""
        honest = [m.submission for m in self.miners[:size]]
        copies = []
        for j in range(size - len(honest)):
            original = self.miners[j % len(self.miners)].submission.read()
            payload = bytes(bytearray(original))  # its own buffer, as a received copy would have
            ident = identity_for(f"scale/copier/{j}")
            digest = Assignment(self.setup.run_id, 0, ident.public_hex, self.s.run.selection.assignment_batches).digest
            header = SubmissionHeader.for_payload(
                run_id=self.setup.run_id, round_=0, base_hash=self.base_hash, payload=payload,
                codec=self.s.run.train.codec, data_digest=digest, sender=ident.public_hex,
            )  # fmt: skip
            copies.append(Submission(sign(ident, header).to_bytes(), payload))
        return honest + copies, len(copies)

    def validator_round(self, size: int) -> RoundRecord:
        subs, copies = self.submissions(size)
        folder = self.folder / f"round{size}"
        shutil.copytree(self.folder / "state", folder)
        prefix = f"validator[{size}]"
        with self.rec.phase(f"{prefix}.open"):
            evaluator = self.evaluator()
            v = SteadyValidator.open(
                folder, self.s.run.gauntlet(), self.setup.run_id, self.identity, evaluator, self.setup.eval_batch
            )
            assert isinstance(v, SteadyValidator)
            v.veterans = tuple(_sender(sub) for sub in subs)
            v.copiers = v.veterans[size - copies :]
        with timed_methods(self.rec, self.validator_steps(evaluator, prefix)), self.rec.phase(f"{prefix}.round"):
            report = v.run_round(subs)
        stats = self.rec.stats
        record = RoundRecord(
            size, copies, report, sum(payload_size(s.payload) + len(s.envelope) for s in subs),
            stats[f"{prefix}.open"].host_start_mb, stats[f"{prefix}.round"].host_peak_mb,
            stats[f"{prefix}.round"].device_peak_mb, stats[f"{prefix}.round"].seconds,
            {k.split(".", 1)[1]: (v.calls, v.seconds) for k, v in stats.items() if k.startswith(prefix + ".")},
        )  # fmt: skip
        del v, evaluator, subs
        shutil.rmtree(folder)
        release_memory()
        steps = ", ".join(f"{k} {sec:.1f} s/{n}" for k, (n, sec) in sorted(record.steps.items()) if k != "round")
        log.info("validator round of %d: %.1f s, peak %.0f MB (%s)", size, record.seconds, record.peak_mb, steps)
        for o in report.outcomes:  # why a round aggregated what it did: its cost depends on it
            log.info("  submission %d: %s %s", o.index, o.status, o.reason[:120])
        return record

    def validator_steps(self, evaluator: GPTEvaluator, prefix: str) -> list[tuple[Any, str, str]]:
        """The steps `Validator.run_round` takes, timed where the library defines them."""
        steps = [
            (validator_core, "screen", "intake"),
            (RoundPipeline, "inspect", "inspect"),
            (RoundPipeline, "evaluate", "evaluate"),
            (RoundPipeline, "decode", "decode"),
            (RoundPipeline, "aggregate", "aggregate"),
            (Validator, "_step", "outer_step"),
            (pulsesync, "encode", "sync_encode"),
            (Validator, "_commit", "commit"),
            (Validator, "_adopt", "adopt"),
            (validator_core, "state_hash", "state_hash"),
            (validator_core, "build_evidence", "evidence"),
            (RoundPipeline, "mark_copies", "mark_copies"),
            (RoundPipeline, "rate", "rate"),
            (RoundPipeline, "__init__", "pipeline_setup"),
            (DecodedSpill, "put", "spill_put"),
            (DecodedSpill, "close", "spill_close"),
            (type(evaluator), "load", "load"),
            (type(evaluator), "loss", "forward"),
        ]
        return [(owner, attr, f"{prefix}.{label}") for owner, attr, label in steps]

    def follow(self, report: RoundReport) -> None:
        with self.rec.phase("follower.apply"):
            new = pulsesync.apply(self.weights, report.patch)
            self.follower_ok = state_hash(new) == report.state_hash
            del new
        release_memory()

    def train_1_5b(self) -> None:
        """The 1.5B architecture with the preset's settings on CUDA: the allocator's peak over a few steps."""
        p = self.s.preset
        model = {"architecture": "qwen2.5-1.5b"}
        setup = RunSetup.from_manifest(run_manifest(p, model, 3, p.data.batch_size, p.data.seq_len, 1))
        with self.rec.phase("miner_1_5b.build"):
            weights = bf16_state(setup.new_model())
            trainer = LMTask(setup).trainer(identity_for("scale/miner-1.5b"), "cuda")
        release_memory()
        torch.cuda.reset_peak_memory_stats()
        with self.rec.phase("miner_1_5b.train"):
            trainer.train(0, weights)
        self.measured_1_5b = {
            "params": float(sum(t.numel() for t in weights.values())),
            "allocated_peak_mb": torch.cuda.max_memory_allocated() / MB,
            "reserved_peak_mb": torch.cuda.max_memory_reserved() / MB,
            "seconds_per_step": self.rec.seconds("miner_1_5b.train") / setup.manifest.train.inner_steps,
        }
        del trainer, weights
        release_memory()


def _sender(sub: Submission) -> str:
    return SignedMessage.from_bytes(sub.envelope).sender_hex


def run(options: Options) -> BenchResult:
    s = settings(options)
    if options.threads > 0:
        torch.set_num_threads(options.threads)
    return_large_frees(s.device.type)  # as `pulse miner` runs on this device
    rec, start = PhaseRecorder(s.device), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pulse-scale-") as tmp:
        bench = Bench(s, rec, Path(tmp))
        if s.measure_1_5b and s.device.type == "cuda":
            bench.train_1_5b()
        bench.create_w0()
        bench.train_miners()
        for size in s.sizes:
            budget = options.budget_seconds
            if bench.rounds and budget and time.perf_counter() - start > budget:
                log.warning("round of %d skipped: the budget of %.0f s is spent", size, budget)
                bench.skipped.append(size)
                continue
            bench.rounds.append(bench.validator_round(size))
            if len(bench.rounds) == 1:
                bench.follow(bench.rounds[0].report)
    return _result(bench)


def _result(b: Bench) -> BenchResult:
    from node.bench.scalereport import summarize  # the figures, tables and projection of a finished run

    return summarize(b)
