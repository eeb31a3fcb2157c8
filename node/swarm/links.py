"""Joins and fetches on a shaped network: the scenarios `pulse bench links` measures and the swarm tier checks.

    with LinkLab(out, "plk", "10.232.7", {"validator": Link.both(1000), "joiner": Link(100, 100)}) as lab:
        lab.serve("validator", run, role="validator", holds="all")
        figures = lab.join("joiner", run)                  # {"join_seconds": ..., ...}

Every process runs inside its host's namespace (`netns.py`) and is stopped (stdin closed, then
SIGKILL of its process group) when the lab closes; the namespaces go with it. A frozen run
(`frozenrun.py`) stands in for the training run, so only bytes and their checks are measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

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
