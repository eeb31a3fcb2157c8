"""`pulse demo`: a whole swarm on loopback, as separate processes, with a live table and a report.

Starts a bootstrap peer (`pulse dht`), a validator, N miners and a follower with a copy of
`configs/tiny.toml` that names a fresh validator key, runs R rounds and stops everyone. Every
role appends JSON lines to `DIR/events/<name>.jsonl` (`node.events`); the demo reads them back as
typed events (`read_events`) to draw the table, and at the end writes `DIR/summary.json`,
`DIR/loss.png`, `DIR/bytes.png` and `DIR/leaderboard.png`. The validator's state folder stays at
`DIR/validator` (`pulse export`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.events import EventLog
from node.events.models import Baseline, Exited, Final, PatchApplied, RoundClosed, Submitted
from node.net.keyfile import write_key_file
from node.run.manifest import Manifest
from node.swarm.netns import ShapedNetwork
from protocol.identity import Identity

STOP_SECONDS = 20.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PRCTL = getattr(ctypes.CDLL(None), "prctl", None)  # Linux only; looked up here, not in a forked child


@dataclass
class Proc:
    name: str
    role: str
    popen: subprocess.Popen[bytes]
    events: Path
    log: Path


@dataclass
class Swarm:
    out: Path
    manifest: Manifest
    rounds: int
    device: str = "cpu"  # where miners train and the validator evaluates (`--device` of each role)
    procs: list[Proc] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)
    unclean: list[str] = field(default_factory=list)  # roles that did not shut down cleanly on Ctrl+C
    net: ShapedNetwork | None = None  # the hosts that roles started with `host=` run on (`netns.py`)

    @property
    def work(self) -> Path:
        return self.out / "work"

    def listen(self, host: str | None) -> str:
        """The address a role listens on: loopback, or its host's address on `net`."""
        if host is None:
            return "/ip4/127.0.0.1/tcp/0"
        assert self.net is not None, "a role on a host needs the swarm's `net`"
        return self.net.maddr(host)

    def spawn(
        self,
        name: str,
        role: str,
        args: list[str],
        *,
        module: str = "node",
        cwd: Path | None = None,
        host: str | None = None,
        nice: int = 0,
    ) -> Proc:
        """Start `python -m module args` as `name` (default: a `pulse` command), logging to `logs/name.log`;
        inside `host`'s namespace when one is named.

        `cwd` (default: this process's) is also put on PYTHONPATH, so modules of a source checkout
        (such as the test tier's hostile peers) can be started from anywhere. `nice` lowers its CPU
        priority by that much.
        """
        events = self.out / "events" / f"{name}.jsonl"
        log = self.out / "logs" / f"{name}.log"
        for folder in (events.parent, log.parent):
            folder.mkdir(parents=True, exist_ok=True)
        events.unlink(missing_ok=True)
        cwd = cwd or Path.cwd()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        if module != "node":
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), env.get("PYTHONPATH")]))
        inside = self.net.exec_prefix(host) if host is not None and self.net is not None else []
        cmd = [*inside, sys.executable, "-m", module, *args]
        popen = subprocess.Popen(
            cmd,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=_own_session(os.getpid(), nice),
        )
        proc = Proc(name, role, popen, events, log)
        self.procs.append(proc)
        return proc

    def start_bootstrap(self, timeout: float = 60.0, extra: Sequence[str] = (), host: str | None = None) -> None:
        listen = self.listen(host)
        args = ["dht", "--config", str(self.out / "run.toml"), "--host", listen, *extra]
        proc = self.spawn("bootstrap", "bootstrap", args, host=host)
        address = listen.rsplit("/tcp/", 1)[0] + "/"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = proc.log.read_text(errors="replace")
            if "ready" in text:
                self.bootstrap = [line for line in text.splitlines() if line.startswith(address)][:1]
                return
            if proc.popen.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the bootstrap peer did not start; see {proc.log}")

    def start_role(
        self,
        name: str,
        role: str,
        key: Path | None,
        *,
        state: str | None = None,
        state_dir: Path | None = None,
        extra: Sequence[str] = (),
        host: str | None = None,
    ) -> Proc:
        """Start `pulse <role>` (on `host` of `net`, if named); its state folder is `state_dir`, else
        `work/<state>` (default: `work/<name>`; a restart reuses one). `extra` flags come last (a later
        flag overrides an earlier one)."""
        args = [
            role,
            "--config",
            str(self.out / "run.toml"),
            "--rounds",
            str(self.rounds),
            "--threads",
            "1",
            "--device",
            self.device,
            "--events",
            str(self.out / "events" / f"{name}.jsonl"),
            "--state-dir",
            str(state_dir or self.work / (state or name)),
            "--host",
            self.listen(host),
            "--initial-peers",
            *self.bootstrap,
        ]
        if key is not None:
            args += ["--key", str(key)]
        return self.spawn(name, role, [*args, *extra], host=host)

    def start_dashboard(self, port: int = 0, timeout: float = 60.0) -> tuple[Proc, str]:
        """Start `pulse dashboard` on the run; returns it and the page's URL once it serves."""
        args = ["dashboard", "--config", str(self.out / "run.toml"), "--port", str(port), "--poll", "1"]
        args += ["--refresh", "2", "--host", "/ip4/127.0.0.1/tcp/0", "--initial-peers", *self.bootstrap]
        proc = self.spawn("dashboard", "dashboard", args)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r" at (http://\S+)", proc.log.read_text(errors="replace"))
            if found:
                return proc, found.group(1)
            if proc.popen.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the dashboard did not start; see {proc.log}")

    def stop(self, proc: Proc) -> None:
        """Ctrl+C a role; SIGKILL its whole process group if it does not exit in time."""
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGINT)
            try:
                proc.popen.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.unclean.append(f"{proc.name}: did not exit within {STOP_SECONDS:.0f}s of Ctrl+C")
                self.kill(proc)
        if _group_alive(proc.popen.pid, wait=5.0):  # its DHT process or libp2p daemon outlived it
            self.unclean.append(f"{proc.name}: left processes behind")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)

    def kill(self, proc: Proc) -> None:
        """SIGKILL a role and everything it started (a crash, for fault tests)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait()

    def stop_all(self) -> None:
        """Stop every role, newest first. Whatever interrupts that (a second Ctrl+C, an error), every
        role's process group still gets SIGKILL on the way out: no child outlives the swarm."""
        try:
            for proc in reversed(self.procs):
                self.stop(proc)
        finally:
            for proc in self.procs:
                if proc.popen.poll() is None or _group_alive(proc.popen.pid, wait=0.0):
                    self.kill(proc)


def _own_session(parent: int, nice: int = 0) -> Callable[[], None]:
    """What a role's child runs before exec: its own session, so that `kill` takes its DHT process and
    libp2p daemon with it; and, on Linux, SIGTERM (a role's clean stop) when the process that started
    it dies, even by SIGKILL, so no role outlives a swarm whose owner was killed. (The kernel sends it
    when the thread that started the child ends: swarms are started from their owner's main thread.)"""

    def prepare() -> None:  # between fork and exec: nothing here may take a lock
        os.setsid()
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the owner died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)
        if nice:
            os.nice(nice)

    return prepare


def _group_alive(pgid: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)


# what a run leaves in the output folder: a new run (of either task) starts without any of it, so an RL
# run does not sit beside the LM run's loss.png and exported model/ (nor its fresh keys beside old state)
RUN_FOLDERS = ("work", "events", "validator", "logs", "model")
RUN_FILES = ("summary.json", "loss.png", "reward.png", "bytes.png", "leaderboard.png")


def fresh_output(out: Path) -> None:
    """Empty `out` of a previous demo's artefacts (only those: other files stay), and create it."""
    for folder in RUN_FOLDERS:
        shutil.rmtree(out / folder, ignore_errors=True)
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def prepare(out: Path, base: Manifest, miners: int, standbys: int = 0) -> tuple[Manifest, Path, list[Path]]:
    """Fresh keys, and the run manifest naming the validator key (then `standbys` more validators, keys
    `keys/standby<i>.key`), written to `out`."""
    keys = out / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    for stale in keys.glob("*.key"):
        stale.unlink()
    validator = Identity.generate()
    write_key_file(validator, keys / "validator.key")
    miner_keys = []
    for i in range(miners):
        write_key_file(Identity.generate(), keys / f"miner{i}.key")
        miner_keys.append(keys / f"miner{i}.key")
    standby_keys = [Identity.generate() for _ in range(standbys)]
    for i, standby in enumerate(standby_keys):
        write_key_file(standby, keys / f"standby{i}.key")
    manifest = base.with_validators([validator.public_hex, *(k.public_hex for k in standby_keys)])
    (out / "run.toml").write_text(manifest.to_toml())
    return manifest, keys / "validator.key", miner_keys


def summarize(log: EventLog, rounds: int) -> dict[str, Any]:
    """The demo's summary (`summary.json`) from every role's events."""
    closed = log.events(RoundClosed)
    baselines = log.events(Baseline)
    finals = log.final_hashes()
    busy = [e.busy_fraction for e in log.events(Final) if e.busy_fraction is not None]
    rss: dict[str, float] = {}
    for r in log.of(Exited):
        rss[r.role] = max(rss.get(r.role, 0.0), round(r.event.peak_rss_mb, 1))
    sent = sum(e.bytes for e in closed)
    dense = sum(e.dense_bytes for e in closed)
    loss_start = [e.loss for e in baselines if e.loss is not None]
    losses = [e.loss for e in closed if e.loss is not None]
    rewards = [e.reward for e in closed if e.reward is not None]
    reward_start = [e.reward for e in baselines if e.reward is not None]
    changed = [e.changed_fraction for e in closed]
    patch = sum(e.patch_bytes for e in closed)
    return {
        "rounds": len(closed),
        "rounds_requested": rounds,
        "hashes_agree": len(finals) >= 2 and len(set(finals.values())) == 1,
        "final_state_hashes": finals,
        "loss_first": loss_start[0] if loss_start else (losses[0] if losses else None),
        "loss_last": losses[-1] if losses else None,
        "loss_per_round": losses,
        "bytes_per_round": [e.bytes for e in closed],
        "dense_bytes_per_round": [e.dense_bytes for e in closed],
        "patch_bytes_per_round": [e.patch_bytes for e in closed],
        "bytes_ratio_vs_dense": dense / sent if sent else None,
        "miner_busy_fraction": sum(busy) / len(busy) if busy else None,
        "reward_first": reward_start[0] if reward_start else None,
        "reward_last": rewards[-1] if rewards else None,
        "reward_per_round": rewards,
        "mean_patch_density": sum(changed) / len(changed) if changed else None,
        # PULSESync patches against shipping the whole BF16 state every round
        "sync_ratio_vs_dense": sum(e.state_bytes for e in closed) / patch if patch else None,
        "peak_rss_mb": rss,
        "role_seconds": role_seconds(log),
        "places_per_round": places([e.scores for e in closed], {key: name for name, key in log.keys().items()}),
    }


def role_seconds(log: EventLog) -> dict[str, dict[str, float]]:
    """Each role's mean seconds per round and phase: a miner's inner step, compress, upload and
    patch apply; the validator's open window, decide (intake, decode, scoring), patch encode and
    whole step. A phase no event reported is left out."""
    submitted, closed = log.events(Submitted), log.events(RoundClosed)
    patches = [r.event for r in log.of(PatchApplied) if r.role == "miner"]
    phases: dict[str, dict[str, list[float | None]]] = {
        "miner": {
            "step": [e.step_seconds for e in submitted],
            "compress": [e.compress_seconds for e in submitted],
            "upload": [e.upload_seconds for e in submitted],
            "apply_patch": [e.seconds for e in patches],
        },
        "validator": {
            "open": [e.open_seconds for e in closed],
            "decide": [e.decide_seconds for e in closed],
            "encode_patch": [e.encode_seconds for e in closed],
            "round": [e.seconds for e in closed],
        },
    }
    out: dict[str, dict[str, float]] = {}
    for role, by_phase in phases.items():
        for phase, values in by_phase.items():
            seen = [v for v in values if v is not None]
            if seen:
                out.setdefault(role, {})[phase] = sum(seen) / len(seen)
    return out


def places(scores: Sequence[Mapping[str, float]], names: Mapping[str, str]) -> dict[str, list[int | None]]:
    """Each miner's place in every round (1: the highest final score among the aggregated), None when
    it was not aggregated; `scores` holds each round's aggregated miners by key."""
    out: dict[str, list[int | None]] = {}
    for i, round_scores in enumerate(scores):
        ranked = sorted(round_scores, key=lambda key: (-round_scores[key], key))
        for place, key in enumerate(ranked, start=1):
            out.setdefault(names.get(key, key[:8]), [None] * len(scores))[i] = place
    return dict(sorted(out.items()))


def plot(summary: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rl = bool(summary["reward_per_round"])
    values = summary["reward_per_round"] if rl else summary["loss_per_round"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    # the value after round r at x = r, as the table numbers rounds; the initial weights' as a line
    ax.plot(range(len(values)), values, marker="o", markersize=3, label="after the round")
    first = summary["reward_first" if rl else "loss_first"]
    if first is not None:
        ax.axhline(first, color="grey", linestyle="--", linewidth=1, label="initial weights")
    ax.legend(fontsize=8)
    if rl:
        ax.set(xlabel="round", ylabel="held-out reward (greedy)", title="Reward per round")
    else:
        ax.set(xlabel="round", ylabel="held-out loss (nats/byte)", title="Loss per round")
    fig.tight_layout()
    fig.savefig(out / ("reward.png" if rl else "loss.png"), dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    n = len(summary["bytes_per_round"])
    ax.bar([i - 0.2 for i in range(n)], summary["dense_bytes_per_round"], width=0.4, label="dense FP32")
    ax.bar([i + 0.2 for i in range(n)], summary["bytes_per_round"], width=0.4, label="sent (compressed)")
    ax.plot(range(n), summary["patch_bytes_per_round"], "k.", label="PULSESync patch")
    ax.set_yscale("log")
    ax.set(xlabel="round", ylabel="bytes", title="Bytes on the wire per round")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))  # beside the bars, not over them
    fig.tight_layout()
    fig.savefig(out / "bytes.png", dpi=120)
    plt.close(fig)

    if summary["places_per_round"]:
        leaderboard_plot(summary["places_per_round"], out / "leaderboard.png")


def leaderboard_plot(places_per_round: Mapping[str, Sequence[int | None]], path: Path) -> None:
    """The leaderboard over rounds: each miner's place among the aggregated (1 at the top); a gap
    where it was not aggregated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    deepest = 1
    for name, row in places_per_round.items():
        ys = [float("nan") if p is None else p for p in row]  # NaN breaks the line: not aggregated
        ax.plot(range(len(row)), ys, marker="o", label=name)
        deepest = max([deepest, *(p for p in row if p is not None)])
    ax.set_ylim(deepest + 0.5, 0.5)
    ax.set_yticks(range(1, deepest + 1))
    ax.set(xlabel="round", ylabel="place (by final score)", title="Leaderboard over rounds")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))  # beside the lines, not over them
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
