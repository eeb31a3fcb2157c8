"""Failover and audit on a real loopback swarm: kill the active validator, and let one lie.

Two runs of separate `pulse` processes (`node/swarm/demo.py`):

1. takeover: two validators (priority a, b), MINERS miners and a `pulse follow --audit` follower
   for ROUNDS rounds. The active validator is killed (SIGKILL, its whole process group) at five
   points of five rounds, and restarted on its state folder after the round was taken over; the
   next kill waits until it has caught up as a standby:

       collecting     1 s after it opened the round
       evaluating     0.3 s after the last miner's submission reached it (closing starts then)
       committed      as soon as its state folder holds the new round (before or as it publishes)
       published      as soon as it logged the round closed (its result was published just before,
                      after the standby took the round's blobs: `replicas.py`; before that was
                      there, nobody else held them and the run waited for the restart)
       serving        0.5 s later (followers fetch the patch from it)

   The killed validator is restarted only once the next round has closed (or the wait for that ran
   out: `stalled_until_restart`, the run waited on the restart, a miss of "at most one round lost").

   Figures: rounds lost per kill (rounds around the kill whose counted result scores none of the
   submissions miners made), whether every node ends on one state hash, submissions scored in
   more than one counted result, audit mismatches (false alarms: every validator is honest), the
   auditor's seconds per round against the validator's, and peak memory of both processes.

2. lies: for each lie of `tests/redteam/pulse_redteam/lying.py`, one validator telling it from round 1
   (`python -m pulse_redteam.faults`), two miners and a `pulse follow --audit` follower: detected if
   the follower reports a mismatch for the first round in which the lie changed anything (round 1 for
   "add" and "patch"; the first round from 1 on with an aggregated submission for "drop" and "scale",
   with a measured one for "median": `lying.told`) and holds no state past the last verified one.
   A lie run lasts up to LIE_ROUNDS rounds, so that the miners, which start in the first rounds, get
   aggregated before it ends; a lie never told is reported as not detected.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from node.bench.report import BenchResult, table
from node.events import EventLog, read_events
from node.events.audit import Audited, AuditMismatch, AuditStarted, Replicated, Standby, TookOver
from node.events.models import Done, Final, Received, RoundClosed, RoundOpened, Submitted
from node.net.keyfile import write_key_file
from node.run.manifest import Manifest, parse_manifest
from node.run.presets import preset
from node.swarm.demo import Proc, Swarm
from protocol.identity import Identity
from protocol.parsing import STRICT
from pulse_redteam.lying import LIES, told

KILL_POINTS = ("collecting", "evaluating", "committed", "published", "serving")
WAIT = 240.0
LIE_ROUNDS = 6


class Options(BaseModel):
    """`pulse bench failover`'s options: the takeover run's size and kill points, and whether the lies run."""

    model_config = STRICT

    rounds: int = Field(default=20, ge=1)
    """rounds of the takeover run"""
    miners: int = Field(default=4, ge=1)
    """miners of the takeover run"""
    deadline: float = Field(default=10.0, gt=0)
    """round deadline in seconds"""
    takeover: float = Field(default=4.0, gt=0)
    """takeover_seconds"""
    out: Path | None = None
    """keep the runs' events and logs here (default: a temporary folder)"""
    skip_lies: bool = False
    """only the takeover run"""
    points: str = ",".join(KILL_POINTS)
    """kill points, in order, comma-separated; as many as fit in --rounds"""

    @field_validator("points")
    @classmethod
    def _known(cls, text: str) -> str:
        unknown = {p for p in text.split(",") if p} - set(KILL_POINTS)
        if unknown:
            raise ValueError(f"no kill point {', '.join(sorted(unknown))} (of {', '.join(KILL_POINTS)})")
        return text

    @property
    def kill_points(self) -> list[str]:
        """`--points`, in order."""
        return [p for p in self.points.split(",") if p]


def run(options: Options) -> BenchResult:
    with contextlib.ExitStack() as stack:
        out = options.out or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pulse-failover-")))
        takeover = _takeover_run(out / "takeover", options)
        lies = {} if options.skip_lies else {lie: _lie_run(out / f"lie-{lie}", lie, options) for lie in LIES}
    detected = sum(1 for found in lies.values() if found["detected"])
    summary = {
        **takeover,
        "lies": lies,
        "lies_detected": detected,
        "lies_total": len(lies),
    }
    kills = [
        [k["point"], k["round"], k["rounds_lost"], k["taken_over_by"], k["next_closed_by"], k["submissions_lost"]]
        for k in takeover["kills"]
    ]
    lie_rows = [
        [lie, f["detected"], f["told_round"], f["verified_round"], "; ".join(f["findings"])[:80]]
        for lie, f in lies.items()
    ]
    tables = [
        table("kills", ["point", "round", "rounds lost", "closed by", "next closed by", "submissions lost"], kills),
        table(
            "takeover run",
            [
                "max rounds lost",
                "stalled",
                "hashes agree",
                "scored twice",
                "false alarms",
                "auditor s/round",
                "validator s/round",
            ],
            [
                [
                    takeover["max_rounds_lost_per_kill"],
                    takeover["kills_stalled_until_restart"],
                    takeover["hashes_agree"],
                    takeover["scored_twice"],
                    takeover["audit_false_alarms"],
                    takeover["auditor_seconds_per_round"],
                    takeover["validator_seconds_per_round"],
                ]
            ],
        ),
        table("lies", ["lie", "detected", "told in round", "follower stays at", "findings"], lie_rows),
    ]
    return BenchResult(summary, tables)


# -- the takeover run ------------------------------------------------------------------------------


def _manifest(options: Options, validators: list[str]) -> Manifest:
    data: dict[str, Any] = tomllib.loads(preset("tiny").read_text())
    data["validators"] = validators
    data["round"].update(
        deadline_seconds=options.deadline,
        min_seconds=3.0,
        checkpoint_every=5,
        takeover_seconds=options.takeover,
        replicate_seconds=2 * options.takeover,  # a loaded machine: the standby's fetches may take seconds
    )
    data["train"]["inner_steps"] = 5
    data["train"]["inner"]["warmup_steps"] = 0  # 5 steps of warmup-scaled rates teach too little to be selected
    data["selection"]["held_out_batches"] = 1
    data["selection"]["assignment_batches"] = 5  # one fresh batch per inner step
    return parse_manifest(data)


def _keys(out: Path, names: list[str]) -> dict[str, tuple[Path, Identity]]:
    folder = out / "keys"
    folder.mkdir(parents=True, exist_ok=True)
    keys = {}
    for name in names:
        identity = Identity.generate()
        write_key_file(identity, folder / f"{name}.key")
        keys[name] = (folder / f"{name}.key", identity)
    return keys


def _takeover_run(out: Path, options: Options) -> dict[str, Any]:
    miners = [f"miner{i}" for i in range(options.miners)]
    keys = _keys(out, ["a", "b", *miners])
    manifest = _manifest(options, [keys["a"][1].public_hex, keys["b"][1].public_hex])
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.toml").write_text(manifest.to_toml())
    swarm = Swarm(out, manifest, options.rounds)
    by_key = {keys[v][1].public_hex: v for v in ("a", "b")}
    procs: dict[str, Proc] = {}
    starts = {"a": 0, "b": 0}
    spawned: dict[str, float] = {}  # process name -> when it was started (unix time)
    kills: list[dict[str, Any]] = []
    peaks: dict[str, float] = {}
    failures: list[str] = []

    def start(v: str) -> None:
        starts[v] += 1
        name = f"validator-{v}-{starts[v]}"
        spawned[name] = time.time()
        procs[v] = swarm.start_role(name, "validator", keys[v][0], state=f"validator-{v}")

    try:
        swarm.start_bootstrap()
        start("a")
        start("b")
        workers = [swarm.start_role(m, "miner", keys[m][0]) for m in miners]
        auditor = swarm.start_role("auditor", "follow", None, extra=["--audit"])
        workers.append(auditor)
        points = options.kill_points
        unknown = set(points) - set(KILL_POINTS)
        if unknown:
            raise ValueError(f"unknown kill points {sorted(unknown)}: choose from {KILL_POINTS}")
        try:
            _kills(swarm, points, options, by_key, procs, kills, peaks, auditor, start, len(miners), out)
        except RuntimeError as exc:  # a wait timed out: the figures say what happened up to here
            failures.append(str(exc))

        def sample() -> None:
            _peak(auditor, peaks, "auditor")
            for p in procs.values():
                _peak(p, peaks, "validator")

        _wait_exits(workers, sample)
    finally:
        swarm.stop_all()
    log = read_events(out / "events")
    figures = _takeover_figures(log, kills, by_key, options.rounds, peaks)
    restarts = _restarts(log, spawned)
    slowest = _max(r["standing_by"] for r in restarts)
    return {**figures, "restarts": restarts, "restart_seconds_max": slowest, "failures": failures}


def _kills(
    swarm: Swarm,
    points: list[str],
    options: Options,
    by_key: dict[str, str],
    procs: dict[str, Proc],
    kills: list[dict[str, Any]],
    peaks: dict[str, float],
    auditor: Proc,
    start: Callable[[str], None],
    miners: int,
    out: Path,
) -> None:
    """Kill the active validator at each of `points` (one round each, as many as fit) and restart it."""
    for point in points:
        # the next round to open (from round 1: the standby holds round 0's blobs, handed over before
        # they were published); the restarted validator caught up as a standby by then
        r = max(_open_round(swarm) + 1, 1)
        if r >= options.rounds - 1:
            break
        active = _active(swarm, by_key, r)
        if active is None:
            break
        _kill_at(swarm, procs[active], point, r, miners, out / "work" / f"validator-{active}")
        _peak(procs[active], peaks, "validator")
        _peak(auditor, peaks, "auditor")
        swarm.kill(procs[active])
        kills.append({"point": point, "round": r, "killed": active, "at": time.time()})
        # a standby takes the round over; if it cannot (killed right after publishing, nobody
        # fetched the round's evidence yet: the standby cannot verify the new state), the run
        # waits for the killed validator to come back, as its operator would restart it
        stalled = not _wait(
            swarm,
            f"round {r + 1} closed",
            functools.partial(_closed, r=r + 1),
            soft=True,
            within=options.deadline + 3 * options.takeover + 20,
        )
        kills[-1]["stalled_until_restart"] = stalled
        start(active)  # it comes back on its state folder: a standby now (or the active one, if stalled)
        _wait(swarm, f"round {r + 1} closed after the restart", functools.partial(_closed, r=r + 1))
        _wait(swarm, f"{procs[active].name} caught up", functools.partial(_caught_up, name=procs[active].name))


def _active(swarm: Swarm, by_key: dict[str, str], r: int) -> str | None:
    """The validator that opens round r (waits for it)."""
    found: list[str] = []

    def opened(log: EventLog) -> bool:
        for logged in log.of(RoundOpened):
            if logged.event.round == r:
                found.append(logged.name.split("-")[1])
                return True
        return False

    _wait(swarm, f"round {r} opened", opened)
    return found[0] if found and found[0] in by_key.values() else None


def _kill_at(swarm: Swarm, proc: Proc, point: str, r: int, miners: int, state: Path) -> None:
    """Return at `point` of round r at the validator `proc` (it is killed right after)."""
    name = proc.name
    if point == "collecting":
        time.sleep(1.0)
    elif point == "evaluating":
        _wait(swarm, f"round {r} submissions", lambda log: _received(log, name, r) >= miners, soft=True)
        time.sleep(0.3)
    elif point == "committed":
        folder = state / "validator" / f"round-{r + 1:012d}"
        _poll(folder.exists, WAIT)
    elif point == "published":
        _wait(swarm, f"round {r} closed", lambda log: log.has(RoundClosed, name, r))
    else:
        _wait(swarm, f"round {r} closed", lambda log: log.has(RoundClosed, name, r))
        time.sleep(0.5)


def _restarts(log: EventLog, spawned: dict[str, float]) -> list[dict[str, Any]]:
    """For each restarted validator: seconds from its start to its state loaded (`audit_start`: the
    process, its DHT node and its state), to standing by at a round, and to its first audited round."""
    return [
        {
            "name": name,
            "state_loaded": _after(log, AuditStarted, name, at),
            "standing_by": _after(log, Standby, name, at),
            "first_audit": _after(log, Audited, name, at),
        }
        for name, at in spawned.items()
        if not name.endswith("-1")  # the first start of each
    ]


def _after(log: EventLog, kind: type[Any], name: str, at: float) -> float | None:
    found = [r.t for r in log.of(kind, name)]
    return round(min(found) - at, 2) if found else None


def _max(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _open_round(swarm: Swarm) -> int:
    return max((e.round for e in read_events(swarm.out / "events").events(RoundOpened)), default=-1)


def _caught_up(log: EventLog, name: str) -> bool:
    """`name` stands by at the round open now (it audited up to it), or is active again, or the run
    is over (its last patch may have no holder left to fetch from: nothing to catch up to)."""
    head = max((e.round for e in log.events(RoundOpened)), default=-1)
    standing = any(e.round >= head for e in log.events(Standby, name))
    over = any(logged.name != name for logged in log.of(Done))
    return standing or log.has(RoundOpened, name) or log.has(Done, name) or over


def _received(log: EventLog, name: str, r: int) -> int:
    return sum(1 for e in log.events(Received, name) if e.round == r)


def _closed(log: EventLog, r: int) -> bool:
    return any(e.round >= r for e in log.events(RoundClosed))


def _takeover_figures(
    log: EventLog, kills: list[dict[str, Any]], by_key: dict[str, str], rounds: int, peaks: dict[str, float]
) -> dict[str, Any]:
    keys = log.keys()
    counted = {e.round: e for e in log.events(Audited, "auditor")}
    closed: dict[tuple[int, str], RoundClosed] = {}
    for logged in log.of(RoundClosed):
        v = logged.name.split("-")[1]
        closed[(logged.event.round, v)] = logged.event
    chain = {r: closed.get((r, by_key.get(a.signer, "?"))) for r, a in counted.items()}
    submitted: dict[int, set[str]] = {}
    for sent in log.of(Submitted):
        submitted.setdefault(sent.event.round, set()).add(keys.get(sent.name, sent.name))
    for k in kills:
        r = k["round"]
        lost = 0
        for rr in (r, r + 1):
            result = chain.get(rr)
            named = set(result.scores) | set(result.rejections) if result is not None else set()
            if submitted.get(rr) and not (named & submitted[rr]):
                lost += 1
        k["rounds_lost"] = lost
        result = chain.get(r)
        named = set(result.scores) | set(result.rejections) if result is not None else set()
        k["submissions_lost"] = len(submitted.get(r, set()) - named)
        signer = counted[r].signer if r in counted else None
        k["taken_over_by"] = by_key.get(signer) if signer else None  # the signer of round r's counted result
        after = counted[r + 1].signer if r + 1 in counted else None
        k["next_closed_by"] = by_key.get(after) if after else None
        del k["at"]
    scored: dict[tuple[str, int], int] = {}
    for r, result in chain.items():
        if result is None:
            continue
        for miner in set(result.scores) | set(result.rejections):
            scored[(miner, r)] = scored.get((miner, r), 0) + 1
    finals = log.final_hashes()
    audited = log.events(Audited, "auditor")
    validator_seconds = [e.seconds for e in log.events(RoundClosed)]
    replicated = log.events(Replicated)
    return {
        "rounds": rounds,
        "rounds_audited": len(counted),
        "kills": kills,
        "takeovers": len(log.events(TookOver)),
        "max_rounds_lost_per_kill": max((k["rounds_lost"] for k in kills), default=0),
        "kills_stalled_until_restart": sum(1 for k in kills if k.get("stalled_until_restart")),
        "replicated_rounds": len(replicated),
        "replicated_acknowledged": sum(1 for e in replicated if e.acknowledged),
        "replicate_seconds_mean": _mean([e.seconds for e in replicated]),
        "hashes_agree": len(set(finals.values())) == 1 and len(finals) > 1,
        "final_hashes": {name: h[:16] for name, h in finals.items()},
        "nodes_final": len(finals),
        "scored_twice": sum(1 for n in scored.values() if n > 1),
        "results_per_round_max": max((sum(1 for (rr, _) in closed if rr == r) for r in counted), default=0),
        "audit_false_alarms": len(log.events(AuditMismatch)),
        "auditor_seconds_per_round": _mean([e.seconds for e in audited]),
        "auditor_compute_seconds_per_round": _mean([e.compute_seconds for e in audited]),
        "validator_seconds_per_round": _mean(validator_seconds),
        "auditor_peak_rss_mb": peaks.get("auditor"),
        "validator_peak_rss_mb": peaks.get("validator"),
    }


# -- the lie runs ----------------------------------------------------------------------------------


def _lie_run(out: Path, lie: str, options: Options) -> dict[str, Any]:
    keys = _keys(out, ["liar", "miner0", "miner1"])
    manifest = _manifest(options, [keys["liar"][1].public_hex])
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.toml").write_text(manifest.to_toml())
    rounds = LIE_ROUNDS
    swarm = Swarm(out, manifest, rounds)
    try:
        swarm.start_bootstrap()
        args_list = ["--lie", lie, "--from-round", "1", *_role_args(swarm, "liar", keys["liar"][0])]
        swarm.spawn("liar", "validator", args_list, module="pulse_redteam.faults")
        for m in ("miner0", "miner1"):
            swarm.start_role(m, "miner", keys[m][0])
        swarm.start_role("auditor", "follow", None, extra=["--audit"])
        last = rounds - 1
        done = lambda log: log.has(AuditMismatch, "auditor") or log.has(RoundClosed, "liar", last)  # noqa: E731
        _wait(swarm, f"{lie}: a mismatch reported or round {last} closed", done, soft=True, within=WAIT + 60 * rounds)
    finally:
        swarm.stop_all()
    log = read_events(out / "events")
    mismatches = log.events(AuditMismatch, "auditor")
    verified = max((e.round for e in log.events(Audited, "auditor")), default=-1)
    finals = [e.round for e in log.events(Final, "auditor")]
    closed = sorted(log.events(RoundClosed, "liar"), key=lambda e: e.round)
    told_round = next((e.round for e in closed if e.round >= 1 and told(lie, e.submissions, e.selected)), None)
    return {
        "detected": bool(mismatches) and mismatches[0].round == told_round and verified < told_round,
        "told_round": told_round,
        "mismatch_round": mismatches[0].round if mismatches else None,
        "findings": mismatches[0].findings if mismatches else [],
        "verified_round": verified,
        "follower_final_rounds": finals,
        "liar_closed_rounds": sorted(e.round for e in log.events(RoundClosed, "liar")),
    }


def _role_args(swarm: Swarm, name: str, key: Path) -> list[str]:
    return [
        "--config", str(swarm.out / "run.toml"),
        "--key", str(key),
        "--state-dir", str(swarm.work / name),
        "--rounds", str(swarm.rounds),
        "--events", str(swarm.out / "events" / f"{name}.jsonl"),
        "--host", "/ip4/127.0.0.1/tcp/0",
        "--initial-peers", *swarm.bootstrap,
    ]  # fmt: skip


# -- helpers ---------------------------------------------------------------------------------------


def _wait(
    swarm: Swarm, what: str, found: Callable[[EventLog], bool], *, soft: bool = False, within: float = WAIT
) -> bool:
    ok = _poll(lambda: found(read_events(swarm.out / "events")), within)
    if not ok and not soft:
        raise RuntimeError(f"timed out waiting for {what}; logs in {swarm.out / 'logs'}")
    return ok


def _poll(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def _wait_exits(workers: list[Proc], sample: Callable[[], object]) -> None:
    """Until every worker has exited (or WAIT passes), calling `sample` twice a second."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and any(p.popen.poll() is None for p in workers):
        sample()
        time.sleep(0.5)


def _peak(proc: Proc, peaks: dict[str, float], role: str) -> None:
    """Peak resident memory (VmHWM) of the role's main process, MB, the largest seen per role."""
    try:
        text = Path(f"/proc/{proc.popen.pid}/status").read_text()
    except OSError:
        return
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            peaks[role] = max(peaks.get(role, 0.0), int(line.split()[1]) / 1024)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None
