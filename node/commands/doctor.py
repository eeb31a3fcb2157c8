"""`pulse doctor --config C --device cuda --initial-peers ...`: measure this machine and its links, forecast.

First the machine (`node.roles.machinefit`): real inner steps of the run's model at the run's batch
on `--device`, their peak device memory, the host's peak, GPU memory, host RAM and disk against what
the run needs, and the run's data digest. Then (unless `--local`) it joins the run's network as a
client for a minute (no heartbeats, no blobs held), measures (`node.roles.doctor.measure`) and prints
the forecast and what to change; `--json` prints it as one object instead.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field
from rich.console import Console
from rich.table import Table

from node.commands.options import add_options, options_from
from node.commands.roles import DEFAULT_CONFIG, no_cuda
from node.net.netconfig import NetConfig, NetOptions
from node.net.p2ppeer import P2PPeer
from node.roles.doctor import measure, reachability
from node.roles.forecast import Forecast, fit_advice, forecast
from node.roles.machinefit import Machine, needs, probe_machine
from node.roles.records import run_records
from node.run.hostmemory import return_large_frees
from node.run.manifest import load_manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.errors import ConfigError, NetworkError
from protocol.identity import Identity


class DoctorOptions(NetOptions):
    """`pulse doctor`'s options, the network's flags among them."""

    config: Path = DEFAULT_CONFIG
    """run manifest TOML"""
    steps: int = Field(default=3, ge=1)
    """inner steps to time (scaled to the run's H)"""
    device: Literal["cpu", "cuda"] = "cpu"
    """where the steps run: the miner's device"""
    local: bool = False
    """measure this machine only: no network, no forecast"""
    probe_mib: float = Field(default=8.0, gt=0, le=1024)
    """MiB sent each way to measure the links"""
    state_dir: Path | None = None
    """where a node here would keep its state"""
    threads: int = Field(default=0, ge=0)
    """torch threads (0: torch's default)"""
    print_json: bool = Field(default=False, alias="json")
    """print one JSON object"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor", help="measure this machine and its links to the run, and forecast whether it keeps up"
    )
    add_options(parser, DoctorOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from(DoctorOptions, args)
        if (missing := no_cuda(options.device)) is not None:
            raise ConfigError(missing)
        setup = RunSetup.from_manifest(load_manifest(options.config))
        config = options.net_config()
        if options.threads > 0:
            torch.set_num_threads(options.threads)
        return_large_frees(options.device)  # as `pulse miner` runs on this device
        with tempfile.TemporaryDirectory(prefix="pulse-doctor-") as tmp:
            folder = options.state_dir or Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            if options.local:
                machine = probe_machine(
                    setup, task_for(setup), device=options.device, steps=options.steps, folder=folder
                )
                return _report_local(machine, setup, options.print_json)
            report = asyncio.run(_diagnose(setup, config, Path(tmp), folder, options))
    except ConfigError as exc:
        print(f"pulse doctor: {exc}", file=sys.stderr)
        return 2
    except NetworkError as exc:
        print(f"pulse doctor: {exc}", file=sys.stderr)
        return 1
    if options.print_json:
        print(json.dumps(report.to_json(), sort_keys=True))
    else:
        show(report, Console())
    return 0


def _report_local(machine: Machine, setup: RunSetup, as_json: bool) -> int:
    advice = fit_advice(machine, setup.manifest)
    if as_json:
        print(json.dumps({"machine": dataclasses.asdict(machine), "advice": advice}, sort_keys=True))
        return 0
    console = Console()
    show_machine(machine, setup.manifest.train.inner_steps, console)
    for line in advice or ["nothing to change: the run fits this machine"]:
        console.print(f"- {line}", markup=False)  # advice quotes TOML: [data]
    return 0


async def _diagnose(
    setup: RunSetup, config: NetConfig, scratch: Path, folder: Path, options: DoctorOptions
) -> Forecast:
    peer = await P2PPeer.create(config, run_records(setup.manifest), Identity.generate(), scratch, role="follower")
    try:
        maddrs = [str(a) for a in await peer.p2p.get_visible_maddrs()]
        measured = await measure(
            setup,
            task_for(setup),
            peer,
            steps=options.steps,
            probe_bytes=int(options.probe_mib * 2**20),
            folder=folder,
            reachability=reachability(maddrs),
            device=options.device,
        )
    finally:
        await peer.shutdown()
    return forecast(measured, setup.manifest)


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} MB"


def _rate(n: float | None) -> str:
    return "not measured" if n is None else f"{8 * n / 1e6:.1f} Mbit/s"


def _s(n: float | None) -> str:
    return "-" if n is None else f"{n:.1f} s"


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def show_machine(machine: Machine, inner_steps: int, console: Console) -> None:
    """The machine against the run: the timed steps, then each resource needed and available."""
    table = Table(title=f"this machine ({machine.device_name})")
    table.add_column("what")
    table.add_column("needed")
    table.add_column("available")
    table.add_column("fits")
    step = f"{machine.step_seconds:.3f} s x H {inner_steps} = {machine.step_seconds * inner_steps:.1f} s a round"
    table.add_row(f"inner step on {machine.device} ({machine.steps} timed)", step, "", "")
    yes_no = {True: "yes", False: "NO", None: "unknown"}
    for need in needs(machine):
        basis = "measured" if need.measured else "bound"
        table.add_row(need.what, f"{_gib(need.needed)} ({basis})", _gib(need.available), yes_no[need.fits])
    pinned = "pinned in the manifest" if machine.data_pinned else "not pinned (data.digest)"
    table.add_row("data", f"{machine.train_tokens:,} train + {machine.held_out_tokens:,} held-out tokens", "", "")
    table.add_row("data digest", machine.data_digest, pinned, "")
    console.print(table)


def show(f: Forecast, console: Console) -> None:
    m = f.measured
    show_machine(m.machine, round(f.train_seconds / max(m.step_seconds, 1e-9)), console)
    measured = Table(title="measured")
    measured.add_column("what")
    measured.add_column("value")
    for row in (
        ("inner step", f"{m.step_seconds:.3f} s (H = {f.train_seconds / max(m.step_seconds, 1e-9):.0f})"),
        ("downlink", f"{_rate(m.down_bytes_per_second)} (from {(m.probed or '-')[:16]})"),
        ("uplink", _rate(m.up_bytes_per_second)),
        ("reachable", m.reachability),
        ("free disk", _mb(m.disk_free)),
        ("available memory", _mb(m.memory_available)),
        ("run", f"round {m.current_round} open, target {m.target_seconds:.1f} s, rounds of {_s(m.round_seconds)}"),
    ):
        measured.add_row(*row)
    console.print(measured)
    verdict = Table(title="forecast")
    verdict.add_column("what")
    verdict.add_column("value")
    yes_no = {True: "yes", False: "no", None: "unknown"}
    for row in (
        ("bytes per round", f"up {_mb(f.bytes_up_per_round)}, down {_mb(f.bytes_down_per_round)}"),
        ("submission", f"{_s(f.submit_seconds)} (compress + upload of a whole payload)"),
        ("makes the round's target", f"{yes_no[f.makes_target]} (sends {f.fraction:.0%} of a payload)"),
        ("trains H steps within a round", f"{yes_no[f.trains_in_a_round]} ({f.train_seconds:.1f} s)"),
        ("join now", f"{_s(f.join_seconds)} for {_mb(m.join_bytes)} ({m.join_patches} patches after the checkpoint)"),
        ("needs", f"disk {_mb(f.disk_needed)}, memory about {_mb(f.memory_needed)} to mine"),
    ):
        verdict.add_row(*row)
    console.print(verdict)
    for line in f.advice or ["nothing to change: this machine keeps up"]:
        console.print(f"- {line}", markup=False)  # advice quotes TOML: [data]
