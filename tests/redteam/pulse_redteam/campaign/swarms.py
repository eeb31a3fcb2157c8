"""Campaign scenarios on loopback: a swarm of real `pulse` processes plus hostile miners, and faults.

    keys = Keys.make(folder, honest=7, hostile=3)
    report = attack_run(out, keys, hostile=[Team("wire", TRANSPORT, 7)], rounds=8)
    report = fault_run(out, keys, rounds=9)

Every run reuses `Swarm` from `node/swarm/demo.py` (bootstrap, validator, miners, follower, each in its
own session so a kill takes its DHT process and daemon along) and checks itself with `ledger.py`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.events import EventLog, read_events
from node.events.campaign import Uploading
from node.events.models import Event, Exited, PatchApplied, Received, RoundClosed, RoundOpened, Started
from node.net.keyfile import load_key_file, write_key_file
from node.run.manifest import Manifest, parse_manifest
from node.run.presets import preset
from node.swarm.demo import Proc, Swarm
from protocol.identity import Identity
from pulse_redteam.campaign import ledger as ledger_mod
from validator.state import StateStore


def campaign_manifest(
    deadline: float,
    validator: str,
    min_indicator_average: float | None = None,
    standby: str | None = None,
    min_seconds: float = 1.0,
) -> Manifest:
    """The tiny preset with the campaign's round timing; `min_indicator_average` replaces the preset's
    record rule (tiny trusts a key's first +1 round so that a demo learns from round 0); `standby`:
    a second validator's key, after `validator` in the manifest's order; `min_seconds`: how long every
    round stays open at least."""
    data: dict[str, Any] = tomllib.loads(preset("tiny").read_text())
    data["round"].update(deadline_seconds=deadline, min_seconds=min_seconds, checkpoint_every=3)
    data["selection"]["held_out_batches"] = 2
    if min_indicator_average is not None:
        data["selection"]["min_indicator_average"] = min_indicator_average
    data["validators"] = [validator] if standby is None else [validator, standby]
    return parse_manifest(data)


def rl_campaign_manifest(deadline: float, validator: str) -> Manifest:
    """The RL preset (PULSELoCo, the warm-started byte GPT) with the campaign's round timing."""
    data: dict[str, Any] = tomllib.loads(preset("rl").read_text())
    data["round"].update(deadline_seconds=deadline, min_seconds=1.0, checkpoint_every=3)
    data["rl"].update(held_out_prompts=32, min_pool_batches=2, pool_wait_seconds=deadline)
    data["validators"] = [validator]
    return parse_manifest(data)


@dataclass
class Keys:
    folder: Path
    validator: Path
    honest: list[Path]
    hostile: list[Path]
    standby: Path  # a second validator's key, for runs with a standby

    @classmethod
    def make(cls, folder: Path, honest: int, hostile: int) -> Keys:
        folder.mkdir(parents=True, exist_ok=True)

        def key(name: str) -> Path:
            path = folder / f"{name}.key"
            if not path.exists():
                write_key_file(Identity.generate(), path)
            return path

        return cls(
            folder,
            key("validator"),
            [key(f"honest{i}") for i in range(honest)],
            [key(f"hostile{i}") for i in range(hostile)],
            key("standby"),
        )

    def validator_hex(self) -> str:
        return load_key_file(self.validator).public_hex

    def standby_hex(self) -> str:
        return load_key_file(self.standby).public_hex


@dataclass(frozen=True)
class Team:
    """One hostile miner process: `keys` identities playing `attacks` (rotating each round if `rotate`)."""

    name: str
    attacks: tuple[str, ...]
    keys: int
    rotate: bool = False
    offset: int = 0  # with rotate: where this process starts in `attacks`
    stride: int = 0  # with rotate: how far every key moves each round (default: this team's keys)


@dataclass
class RunReport:
    name: str
    ledger: ledger_mod.Ledger
    final_loss: float | None
    hashes: dict[str, str]
    crashes: list[str]
    checks: dict[str, bool] = field(default_factory=dict)
    seconds: float = 0.0
    honest_aggregated: dict[int, int] = field(default_factory=dict)  # round -> honest miners aggregated
    validator_peak_mb: float | None = None  # peak resident memory of the validator process (MiB)
    validator_disk_mb: float = 0.0  # peak size of a validator's folder (the largest): state, blobs, inbox (MB)
    final_reward: float | None = None  # RL runs: the validator's held-out reward after the last round
    decide_seconds: list[float] = field(default_factory=list)  # per closed round: the validator's decision time

    @property
    def validator_decide_seconds(self) -> float | None:
        """Mean seconds the validator took to decide a round (intake to selection), None without rounds."""
        return sum(self.decide_seconds) / len(self.decide_seconds) if self.decide_seconds else None

    @property
    def hashes_agree(self) -> bool:
        return len(self.hashes) >= 2 and len(set(self.hashes.values())) == 1

    @property
    def rounds_completed(self) -> int:
        return len(self.ledger.rounds)

    @property
    def honest_per_round(self) -> float:
        """Honest miners aggregated per completed round."""
        return sum(self.honest_aggregated.values()) / max(self.rounds_completed, 1)


class DiskPeak:
    """Samples the size of a folder on a thread (every `interval` s) and keeps the largest."""

    def __init__(self, folder: Path, interval: float = 0.5) -> None:
        self.folder, self.interval, self.peak = folder, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-peak", daemon=True)

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        total = 0
        for dirpath, _, files in os.walk(self.folder):
            for name in files:
                with contextlib.suppress(FileNotFoundError):  # written and removed as we walk
                    total += os.stat(os.path.join(dirpath, name)).st_size
        self.peak = max(self.peak, total)


class CampaignSwarm(Swarm):
    """`Swarm` plus processes started from this checkout's modules (hostile miners, fabricators)."""

    hostile_nice = 0  # how much lower the CPU priority of hostile processes is (`attack_run`)

    def spawn_module(self, name: str, module: str, args: list[str], role: str = "hostile") -> Proc:
        return self.spawn(name, role, args, module=module, nice=self.hostile_nice if role == "hostile" else 0)

    def net_args(self, name: str) -> list[str]:
        return [
            "--rounds",
            str(self.rounds),
            "--events",
            str(self.out / "events" / f"{name}.jsonl"),
            "--state-dir",
            str(self.work / name),
            "--host",
            "/ip4/127.0.0.1/tcp/0",
            "--initial-peers",
            *self.bootstrap,
        ]

    def start_team(self, team: Team, keys: list[Path]) -> Proc:
        args = ["--config", str(self.out / "run.toml"), "--attacks", ",".join(team.attacks), "--threads", "1"]
        args += ["--keys", *map(str, keys), *(["--rotate"] if team.rotate else []), *self.net_args(team.name)]
        args += ["--offset", str(team.offset), "--stride", str(team.stride)]
        return self.spawn_module(team.name, "pulse_redteam.campaign.hostile", args)

    def start_fabricator(self, name: str) -> Proc:
        args = ["--config", str(self.out / "run.toml"), "--threads", "1", *self.net_args(name)]
        return self.spawn_module(name, "pulse_redteam.campaign.fabricator", args)

    def events(self) -> EventLog:
        return read_events(self.out / "events")

    def wait(self, what: str, found: Callable[[EventLog], bool], timeout: float = 300.0) -> EventLog:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = self.events()
            if found(records):
                return records
            time.sleep(0.2)
        raise TimeoutError(f"timed out waiting for {what}")

    def log_text(self, *names: str) -> str:
        return "".join((self.out / "logs" / f"{n}.log").read_text(errors="replace") for n in names)


def has(name: str, kind: type[Event], round_: int | None = None) -> Callable[[EventLog], bool]:
    return lambda log: log.has(kind, name, round_)


def write_manifest(out: Path, manifest: Manifest) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.toml").write_text(manifest.to_toml())


def exit_codes(procs: list[Proc], timeout: float) -> dict[str, int | None]:
    deadline = time.monotonic() + timeout
    codes: dict[str, int | None] = {}
    for proc in procs:
        try:
            codes[proc.name] = proc.popen.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[proc.name] = None
    return codes


def attack_run(
    out: Path,
    keys: Keys,
    teams: list[Team],
    rounds: int,
    *,
    deadline: float = 20.0,
    honest: int | None = None,
    task: str = "lm",
    fabricators: int = 0,
    workers: int = 2,
    min_indicator_average: float | None = None,
    standby: bool = False,
    hostile_nice: int = 0,
    min_seconds: float = 1.0,
    hostile_after_honest: bool = False,
) -> RunReport:
    """Validator, honest miners and a follower for `rounds`, with hostile teams alongside. An RL run
    (`task="rl"`) has `workers` honest inference workers instead of the follower, and `fabricators`
    workers that publish fabricated rollouts. `min_indicator_average`: an LM run's record rule
    (default: the tiny preset's). `standby`: a second validator (an LM run), second in the manifest.
    `hostile_nice`: the hostile processes' CPU priority, that much lower than the honest roles' (on a
    real network attackers run on their own machines; here they share the honest miners' cores).
    `min_seconds`: how long an LM run's rounds stay open at least. The validator waits for the miners
    whose updates it aggregated, not for hostile keys, so a round can close before a hostile process
    (one for many keys, on the honest miners' cores) has played all of its keys.
    `hostile_after_honest`: start the hostile processes only once every honest miner has started.
    Their start-up (Python, torch and a DHT daemon each) otherwise takes the honest miners' cores in
    round 0, which on a real network, with attackers on their own machines, it does not: in one 46%
    run only 2 of 7 honest miners were in round 0, and the run lagged the clean one by that round to
    the end. They then play from round 1 or 2 on (the record rule aggregates nothing before round 2)."""
    start = time.monotonic()
    if task == "rl":
        manifest = rl_campaign_manifest(deadline, keys.validator_hex())
    else:
        second = keys.standby_hex() if standby else None
        manifest = campaign_manifest(deadline, keys.validator_hex(), min_indicator_average, second, min_seconds)
    write_manifest(out, manifest)
    swarm = CampaignSwarm(out, manifest, rounds)
    swarm.hostile_nice = hostile_nice
    try:
        swarm.start_bootstrap()
        validator = swarm.start_role("validator", "validator", keys.validator)
        validators = [validator, *([swarm.start_role("standby", "validator", keys.standby)] if standby else [])]
        honest_procs = [swarm.start_role(f"miner{i}", "miner", k) for i, k in enumerate(keys.honest[:honest])]
        if task == "rl":
            honest_procs += [swarm.start_role(f"worker{i}", "follow", None) for i in range(workers)]
        else:
            honest_procs.append(swarm.start_role("follower", "follow", None))
        if hostile_after_honest:
            miners = [p.name for p in honest_procs if p.role == "miner"]
            with contextlib.suppress(TimeoutError):  # a miner that never starts shows in the report
                swarm.wait("the honest miners' start", lambda log: all(log.has(Started, m) for m in miners), 120.0)
        used = 0
        hostile_procs = [swarm.start_fabricator(f"fabricator{i}") for i in range(fabricators)]
        for team in teams:
            hostile_procs.append(swarm.start_team(team, keys.hostile[used : used + team.keys]))
            used += team.keys
        timeout = 120.0 + rounds * (deadline + 25.0)
        with contextlib.ExitStack() as stack:  # each validator's folder: a standby's inbox is a disk to fill too
            disks = [stack.enter_context(DiskPeak(swarm.work / v.name)) for v in validators]
            codes = exit_codes(honest_procs + hostile_procs, timeout)
        for v in validators:  # each still running (serving the last round's blobs) is a clean end
            alive = v.popen.poll() is None
            swarm.stop(v)
            codes[v.name] = 0 if alive else v.popen.returncode
    finally:
        swarm.stop_all()
    report = make_report(out.name, swarm, codes, killed=set(), seconds=time.monotonic() - start)
    report.validator_disk_mb = round(max(d.peak for d in disks) / 1e6, 2)
    return report


def make_report(
    name: str, swarm: CampaignSwarm, codes: dict[str, int | None], killed: set[str], seconds: float
) -> RunReport:
    records = swarm.events()
    validators = sorted({r.name for r in records if r.role == "validator"})
    ledger = ledger_mod.build(records, swarm.log_text(*validators), frozenset(killed))
    losses = [r.event.loss for _, r in sorted(ledger.rounds.items()) if r.event.loss is not None]
    hashes = records.final_hashes()
    hostile = {p.name for p in swarm.procs if p.role == "hostile"}
    # a crash is a pulse role (validator, miner, follower) that did not exit cleanly
    crashes = [f"{n}: exit {c}" for n, c in codes.items() if c != 0 and n not in killed | hostile]
    report = RunReport(name, ledger, losses[-1] if losses else None, hashes, crashes, seconds=seconds)
    rewards = [r.event.reward for _, r in sorted(ledger.rounds.items()) if r.event.reward is not None]
    report.final_reward = rewards[-1] if rewards else None
    names = records.keys()
    honest_keys = {k for n, k in names.items() if n.startswith("miner")}
    report.honest_aggregated = {r: len(honest_keys & set(c.event.scores)) for r, c in ledger.rounds.items()}
    report.decide_seconds = [s for _, c in sorted(ledger.rounds.items()) if (s := c.event.decide_seconds) is not None]
    peaks = [r.event.peak_rss_mb for v in validators for r in records.of(Exited, v)]
    report.validator_peak_mb = round(max(peaks), 1) if peaks else None
    report.checks["all rounds closed"] = sorted(ledger.rounds) == list(range(swarm.rounds))
    report.checks["hostile processes ran to the end"] = all(codes.get(n) == 0 for n in hostile - killed)
    report.checks["hashes agree"] = report.hashes_agree
    report.checks["no partial blobs at the validator"] = not any(
        p.is_file() for v in validators for p in (swarm.work / v / "blobs" / "partial").glob("*")
    )
    return report


def fault_run(out: Path, keys: Keys, rounds: int = 9, *, deadline: float = 20.0) -> RunReport:
    """Every fault in one swarm, in this order (round numbers with rounds=9):

    r1  a slow uploader is killed (-9) mid-upload
    r1  follower `paused` stops (SIGSTOP) and misses 5 rounds (SIGCONT at r6)
    r2  honest miner0, which holds (re-serves) every patch so far, is killed: later fetches of its
        blobs fall back to the validator or another holder; a late follower joins at r4 and needs them
    r5  the validator is killed mid-round (after a submission arrived) and restarted on its state

    Clock skew runs in process (tests/test_clock_skew_in_process.py) and a full disk is an ordinary
    test (tests/test_disk_full.py): neither needs a swarm.
    """
    start = time.monotonic()
    manifest = campaign_manifest(deadline, keys.validator_hex())
    write_manifest(out, manifest)
    swarm = CampaignSwarm(out, manifest, rounds)
    checks: dict[str, bool] = {}
    killed: set[str] = set()
    try:
        swarm.start_bootstrap()
        validator = swarm.start_role("validator", "validator", keys.validator)
        m0 = swarm.start_role("miner0", "miner", keys.honest[0])
        m1 = swarm.start_role("miner1", "miner", keys.honest[1])
        m2 = swarm.start_role("miner2", "miner", keys.honest[2])
        paused = swarm.start_role("paused", "follow", None)
        slow = swarm.start_team(Team("slow", ("slow",), 1), keys.hostile[:1])

        swarm.wait("the slow upload of round 1", has("slow", Uploading, 1))
        swarm.kill(slow)
        killed.add("slow")
        swarm.wait("the paused follower at round 1", has("paused", PatchApplied, 0))
        os.kill(paused.popen.pid, signal.SIGSTOP)
        swarm.wait("round 2 closing", has("validator", RoundClosed, 2))
        swarm.kill(m0)
        killed.add("miner0")
        swarm.wait("round 4 opening", has("validator", RoundOpened, 4))
        late = swarm.start_role("late", "follow", None)
        swarm.wait("a submission in round 5", lambda log: log.has(Received, round_=5))
        swarm.kill(validator)
        killed.add("validator")
        committed = StateStore(swarm.work / "validator" / "validator").load().book
        validator2 = swarm.start_role("validator2", "validator", keys.validator, state="validator")
        swarm.wait("round 6 opening", has("validator2", RoundOpened, 6))
        os.kill(paused.popen.pid, signal.SIGCONT)
        codes = exit_codes([m1, m2, paused, late], 120.0 + rounds * (deadline + 25.0))
        alive = validator2.popen.poll() is None
        swarm.stop(validator2)
        codes["validator2"] = 0 if alive else validator2.popen.returncode
    finally:
        for proc in swarm.procs:  # a stopped process must not outlive the run
            with contextlib.suppress(ProcessLookupError):
                if proc.popen.poll() is None:
                    os.kill(proc.popen.pid, signal.SIGCONT)
        swarm.stop_all()
    report = make_report(out.name, swarm, codes, killed, time.monotonic() - start)
    records = swarm.events()
    final = StateStore(swarm.work / "validator" / "validator").load().book
    starts = records.events(Started, "validator2")
    hashes = report.hashes
    slow_peer = next((e.peer_id for e in records.events(Started, "slow")), "?")
    checks["kill -9 mid-upload: stream failure logged, no partial file, validator went on"] = (
        f"submit from {slow_peer} failed" in swarm.log_text("validator")
        and report.checks["no partial blobs at the validator"]
        and has("validator", RoundClosed, 2)(records)
    )
    checks["validator restart: resumed at its committed round"] = bool(starts) and starts[0].round == committed.round
    checks["validator restart: ratings intact"] = set(committed.ratings) <= set(final.ratings)
    checks["validator restart: no round closed twice"] = not report.ledger.double_counted
    checks["validator restart: hash chain continuous"] = report.checks["all rounds closed"] and _chain(records)
    checks["follower missing 5 rounds: back on the validator's hash"] = hashes.get("paused") == hashes.get("validator2")
    checks["holder left: late follower on the validator's hash"] = hashes.get("late") == hashes.get("validator2")
    report.checks.update(checks)
    report.checks["info - a fetch from the departed holder failed over"] = "failed: could not open a stream" in (
        swarm.log_text("late")
    )
    return report


def _chain(records: EventLog) -> bool:
    """Every patch a node applied names the state hash the validator published for that round."""
    published = {e.round: e.state_hash for e in records.events(RoundClosed)}
    patches = records.events(PatchApplied)
    return bool(patches) and all(published.get(e.round) == e.state_hash for e in patches)
