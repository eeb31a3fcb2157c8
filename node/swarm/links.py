"""Joins and fetches on a shaped network: the scenarios `pulse bench links` measures and the swarm tier checks.

    with LinkLab(out, "plk", "10.232.7", {"validator": Link.both(1000), "joiner": Link(100, 100)}) as lab:
        lab.serve("validator", run, role="validator", holds="all")
        figures = lab.join("joiner", run)                  # {"join_seconds": ..., ...}

Every process runs inside its host's namespace (`netns.py`) and is stopped (stdin closed, then
SIGKILL of its process group) when the lab closes; the namespaces go with it. A frozen run
(`frozenrun.py`) stands in for the training run, so only bytes and their checks are measured.

`run_rounds` is the other kind: whole rounds of real `pulse` roles (bootstrap, validator, miners),
each on its host, with a model whose payloads make the links matter (`links_manifest`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from node.events import EventLog, read_events
from node.events.models import Late, Missed, RoundClosed, RoundOpened, Submitted
from node.run.manifest import Manifest, parse_manifest
from node.run.presets import preset
from node.swarm.demo import Swarm, prepare
from node.swarm.frozenrun import FrozenRun
from node.swarm.netns import Link, ShapedNetwork

START_SECONDS = 90.0


@dataclass
class Served:
    host: str
    popen: subprocess.Popen[str]
    maddrs: list[str]


class LinkLab:
    def __init__(self, out: Path, prefix: str, subnet: str, hosts: dict[str, Link]) -> None:
        self.out = out
        self.net = ShapedNetwork(prefix, subnet, hosts)
        self.served: list[Served] = []
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PULSE_PROGRESS": "0"}

    def __enter__(self) -> LinkLab:
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.net.create()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for served in self.served:
            self.stop(served)
        self.net.remove()

    def _cmd(self, host: str, args: list[str]) -> list[str]:
        return [
            *self.net.exec_prefix(host),
            sys.executable,
            "-m",
            "node.swarm.frozenrun",
            *args,
            "--host",
            self.net.maddr(host),
        ]

    def initial_peers(self) -> list[str]:
        return [a for s in self.served[:1] for a in s.maddrs[:1]]

    def serve(self, host: str, run: FrozenRun, *, role: str = "holder", holds: str = "checkpoint") -> Served:
        """A validator or holder on `host`, once it is on the network (its first multiaddr known)."""
        state = self.out / "state" / host
        args = [
            "serve",
            str(run.folder),
            "--role",
            role,
            "--holds",
            holds,
            "--state-dir",
            str(state),
            "--initial-peers",
            *self.initial_peers(),
        ]
        log = (self.out / "logs" / f"{host}.log").open("wb")
        popen = subprocess.Popen(
            self._cmd(host, args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=self.env,
            text=True,
            start_new_session=True,
        )
        line = _read_line(popen, START_SECONDS)
        if not line:
            self.stop(Served(host, popen, []))
            raise RuntimeError(f"{host} did not start; see {self.out / 'logs' / f'{host}.log'}")
        served = Served(host, popen, json.loads(line)["maddrs"])
        self.served.append(served)
        return served

    def run_client(
        self, what: str, host: str, run: FrozenRun, timeout: float, name: str | None = None
    ) -> dict[str, Any]:
        """`join` or `fetch` on `host`; its figures. Raises with the log's tail if it fails."""
        name = name or f"{what}-{host}"
        result, state = self.out / f"{name}.json", self.out / "state" / name
        args = [
            what,
            str(run.folder),
            "--state-dir",
            str(state),
            "--out",
            str(result),
            "--initial-peers",
            *self.initial_peers(),
        ]
        log = self.out / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            done = subprocess.run(
                self._cmd(host, args), stdout=out, stderr=subprocess.STDOUT, env=self.env, timeout=timeout
            )
        if done.returncode != 0:
            raise RuntimeError(f"{name} failed ({done.returncode}): {log.read_text(errors='replace')[-3000:]}")
        figures: dict[str, Any] = json.loads(result.read_text())
        return figures

    def start_client(self, what: str, host: str, run: FrozenRun, name: str) -> subprocess.Popen[bytes]:
        """`join` or `fetch` on `host` in the background (a test may kill it mid-transfer)."""
        state, result = self.out / "state" / name, self.out / f"{name}.json"
        args = [
            what,
            str(run.folder),
            "--state-dir",
            str(state),
            "--out",
            str(result),
            "--initial-peers",
            *self.initial_peers(),
        ]
        return self.net.popen(
            host,
            [*self._cmd(host, args)[len(self.net.exec_prefix(host)) :]],
            self.out / "logs" / f"{name}.log",
            self.env,
        )

    def stop(self, served: Served) -> None:
        if served.popen.stdin is not None:
            with contextlib.suppress(OSError):
                served.popen.stdin.close()
        try:
            served.popen.wait(15)
        except subprocess.TimeoutExpired:
            kill_group(served.popen)
        kill_group(served.popen)  # its DHT process and libp2p daemon


def kill_group(popen: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()


def _read_line(popen: subprocess.Popen[str], timeout: float) -> str:
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(popen.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(max(0.0, deadline - time.monotonic())):
                return popen.stdout.readline()
    return ""


# -- whole rounds of real roles on shaped links ------------------------------------------------------


def links_manifest(
    mode: str,
    *,
    inner_steps: int,
    deadline: float,
    width: int = 256,
    layers: int = 4,
    overlap: bool = False,
    fill_steps: int = 0,
    assignment_batches: int = 1,
    outer_lr: float | None = None,
) -> Manifest:
    """The embedded GPT at about 3M parameters with PULSELoCo (FP32 values): payloads of several MB, so
    a miner's link decides when its submission arrives, on a CPU. One assigned batch per round by
    default (timing only: H steps on it overfit, the held-out loss climbs); a run whose loss counts
    assigns one batch per inner step, as the presets do."""
    data: dict[str, Any] = tomllib.loads(preset("tiny").read_text())
    data["model"]["gpt"].update(n_layer=layers, n_embd=width, n_head=4, block_size=64)
    data["data"].update(batch_size=4, seq_len=32)
    data["train"].update(
        inner_steps=inner_steps,
        codec="pulseloco",
        codec_options={"value_format": "fp32"},
        overlap=overlap,
        fill_steps=fill_steps,
    )
    if outer_lr is not None:
        data["train"]["outer"]["lr"] = outer_lr
    data["round"].update(
        deadline_seconds=deadline, min_seconds=1.0, checkpoint_every=4, deadline_mode=mode, quorum=0.75
    )
    data["selection"].update(
        held_out_batches=2, assignment_batches=assignment_batches, random_batches=1, eval_batch_size=4
    )
    return parse_manifest(data)


@dataclass
class RoundsRun:
    swarm: Swarm
    log: EventLog
    miners: dict[str, str]  # name -> host


def run_rounds(
    out: Path,
    net: ShapedNetwork,
    base: Manifest,
    miners: dict[str, str],
    rounds: int,
    *,
    during: Callable[[Swarm], None] | None = None,
) -> RoundsRun:
    """A bootstrap peer and the validator on host "validator", each miner on its host, for `rounds`
    rounds; `during` runs once round 1 has closed (say, `pulse doctor` on another host)."""
    manifest, validator_key, keys = prepare(out, base, len(miners))
    swarm = Swarm(out, manifest, rounds, net=net)
    try:
        swarm.start_bootstrap(timeout=START_SECONDS, host="validator")
        validator = swarm.start_role("validator", "validator", validator_key, host="validator")
        workers = [
            swarm.start_role(name, "miner", key, host=host)
            for (name, host), key in zip(miners.items(), keys, strict=True)
        ]
        if during is not None:
            _wait(lambda: read_events(out / "events").has(RoundClosed, "validator", 1), 120 + 60 * rounds, out)
            during(swarm)
        deadline = time.monotonic() + 180 + rounds * (base.round.deadline_seconds + 30)
        for proc in workers:
            proc.popen.wait(max(1.0, deadline - time.monotonic()))
        swarm.stop(validator)
    finally:
        swarm.stop_all()
    return RoundsRun(swarm, read_events(out / "events"), miners)


def _wait(check: Callable[[], bool], timeout: float, out: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s; logs in {out / 'logs'}")
        time.sleep(0.5)


def round_figures(run: RoundsRun, slow: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What a deadline mode did: round wall time, miners aggregated, misses, the held-out loss."""
    log = run.log
    opened = [r.t for r in log.of(RoundOpened, "validator")]
    closed = log.events(RoundClosed, "validator")
    gaps = [b - a for a, b in itertools.pairwise(opened)][1:]  # round 0 includes every node's start-up
    misses = sum(len(log.events(Missed, name)) + len(log.events(Late, name)) for name in run.miners)
    sent = [s for name in run.miners for s in log.events(Submitted, name)]
    slow_sent = [s for name in slow for s in log.events(Submitted, name)]
    return {
        "rounds": len(closed),
        "round_seconds": statistics.median(gaps) if gaps else None,
        "aggregated_per_round": statistics.mean(c.selected for c in closed) if closed else None,
        "deadline_misses": misses,
        "final_loss": closed[-1].loss if closed else None,
        "submitted": len(sent),
        "slow_fraction_sent": statistics.mean(s.fraction for s in slow_sent) if slow_sent else None,
        "targets": [o.target_seconds for o in log.events(RoundOpened, "validator")],
    }
