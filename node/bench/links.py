"""`pulse bench links`: joins, fetches, round deadlines and `pulse doctor` on a shaped network.

Everything runs on hosts in network namespaces whose links `tc tbf` limits (`node/swarm/netns.py`),
all created here and removed on the way out; needs root, else it says why and stops.

- joins (`node/swarm/links.py`, a frozen run of a random BF16 state, default 0.5B-sized): a plain
  fetch of the checkpoint over a 100 Mbit/s link (`fetch_link_fraction`); a join at 100 Mbit/s from
  a holder at 1 Gbit/s (`join_seconds` against `join_limit_seconds` = bytes needed / link rate); a
  join from one holder whose uplink is 30 Mbit/s, then from three (`multi_source_speedup`).
- deadlines: whole rounds of real roles (validator at 1 Gbit/s, 20% of the miners at 20 Mbit/s up,
  the rest at 100), once with fixed and once with adaptive deadlines: median round wall time,
  miners aggregated per round, deadline misses, the validator's held-out loss after the same rounds.
- busy: miners at 50 Mbit/s training ahead (`overlap`, filling the wait: `train.fill_steps` = H;
  fixed deadlines): the share of wall time they train (`miner_busy_fraction`). Meanwhile `pulse
  doctor` runs on a newcomer host (20 Mbit/s up, 100 down); a miner then starts there, and its join
  and upload times are compared with the doctor's forecasts (`doctor_max_error`: the largest
  relative error).
- overlap: the same miners for 2 x `--rounds` rounds three ways: sequential (no overlap), training
  ahead with H steps, and training ahead filling the wait; each one's busy fraction, round time and
  final held-out loss (`overlap.fill_loss_vs_sequential`: the filled run's loss over the sequential
  one's), at the preset's outer learning rate or `--outer-lr`.

`--cpu-only` skips all of that and times the join's CPU phases alone, in this process
(`joincpu.py`: piece checks, the blob committed, the state loaded, each patch applied).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from node.bench import joincpu
from node.bench.report import BenchResult, table
from node.events import read_events
from node.events.models import CheckpointLoaded, Final, Joined, Late, Missed, Submitted
from node.net.keyfile import write_key_file
from node.roles import doctor
from node.roles.forecast import join_seconds
from node.swarm import frozenrun, netns
from node.swarm.demo import Swarm
from node.swarm.links import LinkLab, links_manifest, round_figures, run_rounds
from protocol.identity import Identity
from protocol.parsing import STRICT

PREFIX, SUBNET = "plb", "10.232.61"  # namespaces are <prefix>-<pid>-<n>-<host>: unique per run (`netns.py`)
JOIN_MBIT, HOLDER_MBIT = 100.0, 30.0
SLOW_MBIT, FAST_MBIT, BUSY_MBIT = 20.0, 100.0, 50.0
NEWCOMER = netns.Link(20, 100)
DOCTOR_SECONDS = 240.0
# rounds after round 1 for the doctor (tens of seconds: its own training and link probes, while the
# busy miners' rounds take a few seconds each), then the newcomer's join and uploads to time
NEWCOMER_ROUNDS = 24


class Options(BaseModel):
    """`pulse bench links`' options: the sizes of its runs, the namespaces' names, or `--cpu-only`."""

    model_config = STRICT

    state_mib: float = Field(default=942.0, gt=0)
    """frozen state size (0.5B params in BF16)"""
    miners: int = Field(default=5, ge=1)
    """miners per deadline mode (a fifth of them slow)"""
    rounds: int = Field(default=6, ge=1)
    """rounds per deadline mode"""
    inner_steps: int = Field(default=8, ge=1)
    """inner steps per round"""
    deadline: float = Field(default=30.0, gt=0)
    """the manifest's round deadline (s)"""
    busy_inner_steps: int = Field(default=48, ge=1)
    """inner steps per round of the busy miners"""
    outer_lr: float | None = Field(default=None, gt=0)
    """the overlap part's outer learning rate, every mode (default: the tiny preset's)"""
    skip: list[Literal["joins", "deadlines", "busy", "overlap"]] = Field(default_factory=list)
    """parts to skip"""
    prefix: str = Field(default=PREFIX, pattern=r"^[A-Za-z][A-Za-z0-9-]{0,15}$")
    """namespace name prefix (a letter, then letters, digits and hyphens: 16 at most)"""
    subnet: str = Field(default=SUBNET, pattern=r"^\d{1,3}\.\d{1,3}\.\d{1,3}$")
    """the hosts' /24, first three octets"""
    cpu_only: bool = False
    """only the join's CPU phases, in one process (no namespaces needed)"""
    patches: int = Field(default=3, ge=0)
    """patches after the checkpoint (--cpu-only)"""
    repeat: int = Field(default=3, ge=1)
    """runs per phase, the fastest kept (--cpu-only)"""
    dir: Path | None = None
    """work folder, kept (default: a temp folder, removed)"""

    @property
    def state_bytes(self) -> int:
        """`--state-mib` in bytes."""
        return int(self.state_mib * 2**20)


def run(options: Options) -> BenchResult:
    if options.cpu_only:
        phases = {"join_cpu": joincpu.phases(options.state_bytes, options.patches, options.repeat)}
        return BenchResult(summary=phases, tables=_tables(phases))
    why = netns.available(options.prefix)
    if why is not None:
        raise SystemExit(f"pulse bench links needs network namespaces: {why}")
    summary: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        root = options.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pulse-bench-links-")))
        if "joins" not in options.skip:
            summary.update(joins(root / "joins", options.state_bytes, options))
        if "deadlines" not in options.skip:
            modes = ("fixed", "adaptive")
            summary["deadline_modes"] = {mode: deadline_mode(root / mode, mode, options) for mode in modes}
        if "busy" not in options.skip:
            summary.update(busy_and_doctor(root / "busy", options))
        if "overlap" not in options.skip:
            summary["overlap"] = overlap_modes(root / "overlap", options)
    return BenchResult(summary=summary, tables=_tables(summary))


# -- joins ---------------------------------------------------------------------------------------------


def joins(out: Path, state_bytes: int, options: Options) -> dict[str, Any]:
    run = frozenrun.make(out / "run", state_bytes, patches=3)
    size = run.facts["checkpoint"]["size"]
    hosts = {
        "validator": netns.Link.both(1000),
        "seed": netns.Link(1000, 1000),
        "h1": netns.Link(HOLDER_MBIT, 1000),
        "h2": netns.Link(HOLDER_MBIT, 1000),
        "h3": netns.Link(HOLDER_MBIT, 1000),
        "joiner": netns.Link(JOIN_MBIT, JOIN_MBIT),
    }
    limit = 600 + 8 * size / (HOLDER_MBIT * 1e6)
    with LinkLab(out / "lab", options.prefix, options.subnet, hosts) as lab:
        lab.serve("validator", run, role="validator", holds="chain")
        seed = lab.serve("seed", run)
        fetched = lab.run_client("fetch", "joiner", run, timeout=limit, name="fetch")
        joined = lab.run_client("join", "joiner", run, timeout=limit, name="join-100")
        lab.stop(seed)
        lab.served.remove(seed)
        lab.serve("h1", run)
        one = lab.run_client("join", "joiner", run, timeout=limit, name="join-one")
        lab.serve("h2", run)
        lab.serve("h3", run)
        three = lab.run_client("join", "joiner", run, timeout=limit, name="join-three")
        events = {name: read_events(lab.out / "state" / name) for name in ("join-100", "join-one", "join-three")}
    needed = _join_bytes(events["join-100"], size + run.facts["index_size"] + run.facts["patch_bytes"])
    loaded = {name: log.events(CheckpointLoaded)[-1] for name, log in events.items()}
    return {
        "state_bytes": size,
        "fetch_seconds": fetched["fetch_seconds"],
        "fetch_link_fraction": 8 * size / fetched["fetch_seconds"] / (JOIN_MBIT * 1e6),
        "join_seconds": joined["join_seconds"],
        "join_bytes": needed,
        "join_limit_seconds": 8 * needed / (JOIN_MBIT * 1e6),
        "join_one_holder_seconds": one["join_seconds"],
        "join_three_holders_seconds": three["join_seconds"],
        "multi_source_speedup": one["join_seconds"] / three["join_seconds"],
        "join_holders": {name: e.holders for name, e in loaded.items()},
    }


def _join_bytes(log: Any, default: int) -> int:
    joined = log.events(Joined)
    return int(joined[-1].bytes) if joined else default


# -- deadlines -----------------------------------------------------------------------------------------


def _miner_hosts(count: int, slow_share: float) -> tuple[dict[str, str], dict[str, netns.Link], frozenset[str]]:
    slow = max(1, round(count * slow_share))
    miners = {f"miner{i}": f"m{i}" for i in range(count)}
    links = {f"m{i}": netns.Link(SLOW_MBIT if i < slow else FAST_MBIT, 1000) for i in range(count)}
    return miners, links, frozenset(f"miner{i}" for i in range(slow))


def deadline_mode(out: Path, mode: str, options: Options) -> dict[str, Any]:
    miners, links, slow = _miner_hosts(options.miners, 0.2)
    manifest = links_manifest(mode, inner_steps=options.inner_steps, deadline=options.deadline)
    net = netns.ShapedNetwork(options.prefix, options.subnet, {"validator": netns.Link.both(1000), **links})
    with net:
        done = run_rounds(out, net, manifest, miners, options.rounds)
    figures = round_figures(done, slow)
    figures.pop("targets", None)
    return figures


# -- busy miners and `pulse doctor` --------------------------------------------------------------------


def _busy_miners(options: Options) -> tuple[dict[str, str], dict[str, netns.Link]]:
    """The busy miners (name -> host) and the hosts: the validator's and one per miner at 50 Mbit/s up."""
    count = max(2, options.miners - 2)
    hosts = {"validator": netns.Link.both(1000)} | {f"m{i}": netns.Link(BUSY_MBIT, 1000) for i in range(count)}
    return {f"miner{i}": f"m{i}" for i in range(count)}, hosts


def _busy_fractions(log: Any, miners: dict[str, str]) -> list[float]:
    """Each miner's busy fraction as it reported it at the end (`Final`)."""
    return [e.busy_fraction for name in miners for e in log.events(Final, name) if e.busy_fraction is not None]


def busy_and_doctor(out: Path, options: Options) -> dict[str, Any]:
    miners, hosts = _busy_miners(options)
    hosts["newcomer"] = NEWCOMER
    # fixed deadlines: every submission the newcomer makes in time is taken, so its uploads can be timed
    steps = options.busy_inner_steps
    manifest = links_manifest("fixed", inner_steps=steps, deadline=options.deadline, overlap=True, fill_steps=steps)
    report: dict[str, Any] = {}

    def doctor_then_newcomer(swarm: Swarm) -> None:
        report.update(_doctor(swarm))
        key = swarm.out / "keys" / "newcomer.key"
        write_key_file(Identity.generate(), key)  # a fresh key: anyone may mine
        swarm.start_role("newcomer", "miner", key, host="newcomer")

    net = netns.ShapedNetwork(options.prefix, options.subnet, hosts)
    with net:
        rounds = options.rounds + 2 + NEWCOMER_ROUNDS
        done = run_rounds(out, net, manifest, miners, rounds, during=doctor_then_newcomer)
    log = done.log
    busy = _busy_fractions(log, miners)
    observed = _newcomer(log)
    errors = _forecast_errors(report, observed)
    return {
        "miner_busy_fraction": statistics.mean(busy) if busy else None,
        "miner_busy_fractions": busy,
        "doctor": {"forecast": _forecast_summary(report), "observed": observed, "errors": errors},
        "doctor_max_error": max(errors.values()) if errors else None,
    }


def overlap_modes(out: Path, options: Options) -> dict[str, Any]:
    """Busy fraction, round time and final loss of the same miners trained sequentially, ahead with
    H steps, and ahead filling the wait (up to 2H steps), over the same rounds."""
    (miners, hosts), steps = _busy_miners(options), options.busy_inner_steps
    modes = {"sequential": (False, 0), "overlap": (True, 0), "fill": (True, steps)}
    figures: dict[str, Any] = {}
    for name, (overlap, fill) in modes.items():
        manifest = links_manifest(  # one fresh batch per inner step: a run that learns, whose loss says something
            "fixed", inner_steps=steps, deadline=options.deadline, overlap=overlap, fill_steps=fill,
            assignment_batches=steps, outer_lr=options.outer_lr,
        )  # fmt: skip
        with netns.ShapedNetwork(options.prefix, options.subnet, hosts) as net:
            done = run_rounds(out / name, net, manifest, miners, 2 * options.rounds)
        busy = _busy_fractions(done.log, miners)
        sent = [s.step_seconds for m in miners for s in done.log.events(Submitted, m) if s.step_seconds]
        rounds = round_figures(done)
        figures[name] = {
            "busy_fraction": statistics.mean(busy) if busy else None,
            "round_seconds": rounds["round_seconds"],
            "final_loss": rounds["final_loss"],
            "aggregated_per_round": rounds["aggregated_per_round"],
            "step_seconds": statistics.median(sent) if sent else None,
        }
    fill, sequential = figures["fill"]["final_loss"], figures["sequential"]["final_loss"]
    figures["fill_loss_vs_sequential"] = fill / sequential if fill and sequential else None
    return figures


def _doctor(swarm: Swarm) -> dict[str, Any]:
    """`pulse doctor --json` on the newcomer host; its forecast."""
    args = ["doctor", "--config", str(swarm.out / "run.toml"), "--json", "--threads", "1", "--probe-mib", "8"]
    args += ["--host", swarm.listen("newcomer"), "--initial-peers", *swarm.bootstrap]
    proc = swarm.spawn("doctor", "doctor", args, host="newcomer")
    try:
        proc.popen.wait(DOCTOR_SECONDS)
    except Exception:
        swarm.stop(proc)
        raise
    lines = [line for line in proc.log.read_text(errors="replace").splitlines() if line.startswith("{")]
    if proc.popen.returncode != 0 or not lines:
        raise RuntimeError(f"pulse doctor failed ({proc.popen.returncode}); see {proc.log}")
    forecast: dict[str, Any] = json.loads(lines[-1])
    return forecast


def _newcomer(log: Any) -> dict[str, Any]:
    joined = log.events(Joined, "newcomer")
    sent = [s for s in log.events(Submitted, "newcomer") if s.upload_seconds]
    return {
        "join_seconds": joined[0].seconds if joined else None,
        "join_bytes": joined[0].bytes if joined else None,
        "join_patches": joined[0].patches if joined else None,
        "uploads": [(s.bytes, s.upload_seconds, s.fraction) for s in sent],
        "missed_rounds": len(log.events(Missed, "newcomer")) + len(log.events(Late, "newcomer")),
        "submitted_rounds": len(sent),
    }


def _forecast_errors(f: dict[str, Any], observed: dict[str, Any]) -> dict[str, float]:
    """Relative errors |forecast - observed| / observed of the join time and each upload's time."""
    errors: dict[str, float] = {}
    m = f.get("measured", {})
    if f.get("join_seconds") and observed["join_seconds"]:
        errors["join_seconds"] = abs(f["join_seconds"] - observed["join_seconds"]) / observed["join_seconds"]
        # the run moves on between the forecast and the join (more patches, a newer checkpoint): the
        # doctor's rates applied to the join that then happened say how well it measured this machine
        measured = doctor.Measured(**m) if m else None
        same = measured and join_seconds(measured, observed["join_bytes"], observed["join_patches"] or 0)
        if same:
            errors["join_seconds_same_plan"] = abs(same - observed["join_seconds"]) / observed["join_seconds"]
    up = m.get("up_bytes_per_second")
    uploads = observed["uploads"]
    if up and uploads:
        # the doctor's uplink applied to the payloads the newcomer then sent
        errs = [abs(b / up - s) / s for b, s, _ in uploads if s > 0]
        errors["upload_seconds"] = statistics.median(errs)
    return errors


def _forecast_summary(f: dict[str, Any]) -> dict[str, Any]:
    m = f.get("measured", {})
    keys = ("makes_target", "fraction", "join_seconds", "upload_seconds", "submit_seconds", "target_seconds")
    return {k: f.get(k) for k in keys} | {
        "up_mbit": 8 * m["up_bytes_per_second"] / 1e6 if m.get("up_bytes_per_second") else None,
        "down_mbit": 8 * m["down_bytes_per_second"] / 1e6 if m.get("down_bytes_per_second") else None,
        "join_bytes": m.get("join_bytes"),
    }


# -- tables --------------------------------------------------------------------------------------------


def _tables(s: dict[str, Any]) -> list[Any]:
    out = []
    if "join_cpu" in s:
        c = s["join_cpu"]
        rows = [[name, sec, c["seconds_per_gib"][name]] for name, sec in c["seconds"].items()]
        rows.append(["after the last byte", c["after_download_seconds"], c["after_download_seconds_per_gib"]])
        out.append(table(f"join CPU ({c['state_bytes'] / 2**20:.0f} MiB state)", ["phase", "seconds", "s/GiB"], rows))
    if "join_seconds" in s:
        rows = [
            ["plain fetch at 100 Mbit/s", s["fetch_seconds"], f"{s['fetch_link_fraction']:.0%} of the link"],
            ["join at 100 Mbit/s", s["join_seconds"], f"limit {s['join_limit_seconds']:.1f} s"],
            ["join, one 30 Mbit/s holder", s["join_one_holder_seconds"], ""],
            ["join, three 30 Mbit/s holders", s["join_three_holders_seconds"], f"{s['multi_source_speedup']:.2f}x"],
        ]
        out.append(table(f"joins ({s['state_bytes'] / 2**20:.0f} MiB state)", ["what", "seconds", "figure"], rows))
    if "deadline_modes" in s:
        cols = ["round_seconds", "aggregated_per_round", "deadline_misses", "final_loss", "slow_fraction_sent"]
        rows = [[mode, *(f.get(c) for c in cols)] for mode, f in s["deadline_modes"].items()]
        out.append(table("deadlines: 20% of miners at 20 Mbit/s", ["mode", *cols], rows))
    if "miner_busy_fraction" in s:
        e = s["doctor"]["errors"]
        rows = [["miner busy fraction at 50 Mbit/s", s["miner_busy_fraction"]]]
        rows += [[f"doctor error: {k}", v] for k, v in e.items()]
        out.append(table("busy miners, pulse doctor", ["what", "value"], rows))
    if "overlap" in s:
        cols = ["busy_fraction", "round_seconds", "step_seconds", "aggregated_per_round", "final_loss"]
        rows = [[mode, *(f.get(c) for c in cols)] for mode, f in s["overlap"].items() if isinstance(f, dict)]
        out.append(table("sequential, ahead, ahead filling the wait (50 Mbit/s)", ["mode", *cols], rows))
    return out
