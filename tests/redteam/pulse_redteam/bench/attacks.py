"""attacks: the attack and fault campaign against real loopback swarms.

Runs, with the tiny preset and the same keys throughout: a clean run (the honest miners alone),
the same honest miners with 30% and with 45% hostile miners (each hostile key plays a different
attack every round, so every attack is met; their processes start once the honest miners have, as
on a real network their start-up would not take the honest miners' cores), then one swarm per
scenario (`SCENARIO_RUNS`, hostile and honest processes started together: a run that starts under a
flood is what the floods measure; the network attacks, which play on a running swarm, the
tiny-dense payloads and the attacks on standing start once the honest miners have, as the hostile
runs do): the honest miners beside one attack alone, so that the run's figures say what it costs
(the flood of fresh keys, the same flood from 4 times the keys, a flood of valid noise, the same
noise made to fail once decoded, the network attacks all at once every round, fabricated rollouts,
tiny dense payloads, slices of the public step then whispers from the same keys); then one
swarm with every fault. Scenarios on the RL preset (PULSELoCo, rollout workers) are measured
against a clean RL run. The campaign's code (hostile processes, payload crafting, the ledger) is
`tests/redteam/pulse_redteam/campaign/`.

Figures: `hostile_aggregated` (hostile pushes aggregated, all runs; `hostile_aggregated_detectable`
counts only attacks visible in the payload), `hostile_late` (pushes refused only because their round
had closed when they arrived: the hostile process ran behind, and the validator never judged them)
and `attacks_not_played` (attacks whose every push was late), `crashes` (validator or honest
processes that exited non-zero), `unaccounted_submissions` (pushes or received submissions without
exactly one logged outcome, rounds closed twice, network attacks whose defence failed),
`final_loss_*` (the validator's held-out loss after the last round), `faults_recovered` /
`faults_total`. Per run under attack, against the clean run of its task: rounds completed and honest
miners aggregated per round; the worst of each over the runs is `rounds_completed_ratio` and
`honest_aggregated_ratio` (targets 1.0 and >= 0.9). The validator's peak resident memory and the
peak size of its folder (state, blobs, inbox, sampled every 0.5 s), the largest over the runs in
`validator_peak_mb_max` and `validator_disk_mb_max`; every node's final state hash in `per_run`,
with the validator's mean seconds to decide a round (`validator_decide_seconds`, and its ratio to
the clean run's; the largest ratio is `validator_decide_ratio_max`): an attack that leaves every
round complete may still slow the validator down.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from node.bench.report import BenchResult, table
from protocol.parsing import STRICT
from protocol.warmup import warm_up
from pulse_redteam.campaign import attacks, ledger, netns, swarms
from validator.config import GauntletConfig

ATTACK_COLUMNS = [
    "attack",
    "detectable",
    "pushes",
    "refused, rejected or held",
    "late",
    "outscored",
    "aggregated",
    "rounds until excluded",
    "unaccounted",
]
RUN_COLUMNS = [
    "run",
    "rounds",
    "vs clean",
    "honest aggregated / round",
    "vs clean",
    "validator decides (s, x clean)",
    "validator MB",
    "disk MB",
    "hashes",
]


@dataclass(frozen=True)
class Scenario:
    """A run of the honest miners beside one attack: a hostile team, fabricating workers, or both."""

    name: str
    task: str  # "lm" or "rl": which clean run it is measured against
    teams: tuple[swarms.Team, ...] = ()
    fabricators: int = 0
    does: str = ""  # what the run plays, when it is not one attack of `ATTACKS` by its name
    standby: bool = False  # a second validator in the manifest, running as a standby
    after_honest: bool = False  # hostile processes start once the honest miners have (`attack_run`)
    hostile_nice: int | None = None  # the hostile processes' nice, if not the campaign's (`Options.hostile_nice`)

    @property
    def keys(self) -> int:
        return sum(team.keys for team in self.teams)


SCENARIO_RUNS = (
    Scenario("flood", "lm", (swarms.Team("flood", ("flood",), 1),)),
    Scenario("noise-flood", "lm", (swarms.Team("noise-flood", ("noise-flood",), 1),)),
    Scenario("late-flood", "lm", (swarms.Team("late-flood", ("late-flood",), 1),)),
    # the same flood from 4 processes: 4 x the fresh keys, for the validator's memory and disk
    Scenario(
        "flood-x4",
        "lm",
        (swarms.Team("flood-x4", ("flood",), 4),),
        does=f"{4 * attacks.FLOOD} fresh keys a round (the flood from 4 keys): memory and disk must not grow",
    ),
    # the network attacks (`attacks.NETWORK`), every one of them in every round, one process each
    Scenario(
        "network",
        "lm",
        tuple(swarms.Team(a, (a,), 1) for a in attacks.NETWORK),
        does=f"every round, all at once: {', '.join(attacks.NETWORK)}",
        # started with the honest miners, eight hostile processes' start-up (Python, torch, a DHT
        # daemon each) delayed theirs by 5-6 s: every run lost round 0, which a network attacker on its
        # own machines does not cause. Started after them, the attacks play in rounds 2-7 of 8
        after_honest=True,
    ),
    Scenario("rl-fabricated", "rl", fabricators=1),
    Scenario("rl-unserved", "rl", (swarms.Team("rl-unserved", ("rl-unserved",), 1),)),
    Scenario("rl-push-flood", "rl", (swarms.Team("rl-push-flood", ("rl-push-flood",), 1),)),
    Scenario("dht-evict", "lm", (swarms.Team("dht-evict", ("dht-evict",), 1),)),
    Scenario("standby-flood", "lm", (swarms.Team("standby-flood", ("standby-flood",), 1),), standby=True),
    # a payload attack, not a flood: started with the honest miners, its two processes' start-up
    # delayed theirs past round 0 (0 honest miners aggregated there, 0.87 of the clean run), which
    # an attacker on its own machines does not cause
    Scenario("tiny-dense", "rl", (swarms.Team("tiny-dense", ("tiny-dense",), 2),), after_honest=True),
    # slices of the public step in one round, whispers from the same keys in the next. Each round's
    # 40 payloads cost about 2 s of one core: at the campaign's nice every one landed after its round
    # had closed (15 s after the open; the round closed at 5 s) and the attack was never judged
    Scenario(
        "standing",
        "lm",
        (swarms.Team("standing", ("public-slice", "median-whisper"), 1, rotate=True),),
        does="40 keys send slices of the public step in one round, random updates at 1/100 of its norm in the next",
        after_honest=True,
        hostile_nice=0,
    ),
)
RL_MINERS, RL_WORKERS = 4, 2


class Options(BaseModel):
    """`pulse bench attacks`' options: the runs' sizes, the hostile shares and the parts played."""

    model_config = STRICT

    honest: int = Field(default=7, ge=1)
    """honest miners in every run"""
    rounds: int = Field(default=8, ge=1)
    """rounds per attack run"""
    hostile_nice: int = Field(default=10, ge=0, le=19)
    """how much lower the hostile processes' CPU priority is (nice): on a real network attackers run
    on their own machines, here they share the honest miners' cores (0: the same priority)"""
    fault_rounds: int = Field(default=9, ge=1)
    """rounds of the fault run (at least 9)"""
    deadline: float = Field(default=20.0, gt=0)
    """round deadline in seconds"""
    min_seconds: float = Field(default=5.0, gt=0)
    """how long every LM round stays open at least. The validator waits for the miners it aggregated,
    not for hostile keys, so a hostile process (niced, on the honest miners' cores) that falls behind
    the rounds arrives after their close and its attack is never judged (at 1 s, 3 of 24 pushes of
    the 30% run); an attacker on its own machine would be on time. `hostile_late` and
    `attacks_not_played` say whether it happened"""
    min_indicator_average: float = Field(default=GauntletConfig().min_indicator_average, ge=0, le=1)
    """the indicator record a key needs before its +1 rounds count, in the LM runs: a real run's (the
    home presets'), not the tiny demo's 0 (which trusts a key's first +1 round)"""
    fractions: str = "0.30,0.45"
    """hostile fractions of all miners, comma-separated"""
    skip_faults: bool = False
    """skip the run with every fault"""
    skip_netns: bool = False
    """skip the swarm across two network namespaces"""
    skip_scenarios: bool = False
    """skip the one-attack runs (flood, RL, ...)"""
    scenarios: str = ",".join(sc.name for sc in SCENARIO_RUNS)
    """the one-attack runs to play, comma-separated"""
    rl_deadline: float = Field(default=30.0, gt=0)
    """round deadline of the RL runs"""
    out: Path | None = None
    """keep the runs' logs here (default: a temporary folder)"""

    @field_validator("fractions")
    @classmethod
    def _shares(cls, text: str) -> str:
        """Each a share strictly between 0 and 1 (the hostile miners are f / (1 - f) x the honest);
        none at all (`--fractions ""`) plays no mixed runs."""
        try:
            shares = [float(w) for w in text.split(",") if w]
        except ValueError:
            shares = [-1.0]
        if not all(0 < f < 1 for f in shares):
            raise ValueError(f"{text!r} is not comma-separated fractions between 0 and 1 (e.g. 0.30,0.45)")
        return text

    @model_validator(mode="after")
    def _timing(self) -> Options:
        if self.min_seconds > self.deadline:
            raise ValueError(f"min_seconds {self.min_seconds} is past the deadline {self.deadline}")
        return self

    @field_validator("scenarios")
    @classmethod
    def _known(cls, text: str) -> str:
        unknown = {w for w in text.split(",") if w} - {sc.name for sc in SCENARIO_RUNS}
        if unknown:
            raise ValueError(
                f"no scenario {', '.join(sorted(unknown))} (of {', '.join(sc.name for sc in SCENARIO_RUNS)})"
            )
        return text

    @property
    def hostile_fractions(self) -> list[float]:
        """`--fractions` as numbers, in order."""
        return [float(f) for f in self.fractions.split(",") if f]


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run(options: Options) -> BenchResult:
    fractions = options.hostile_fractions
    hostile = [max(1, math.ceil(f * options.honest / (1 - f) - 1e-9)) for f in fractions]
    out = options.out or Path(tempfile.mkdtemp(prefix="pulse-bench-attacks-"))
    # the codec kernels compiled here, once: on a cold cache every process of the first swarm compiled
    # them at once, and the clean run's start took 50 s of the 2 cores (round 0 closed with no miner)
    _say(f"codec kernels ready ({warm_up():.1f} s)")
    team_keys = max((sc.keys for sc in SCENARIO_RUNS), default=1)
    keys = swarms.Keys.make(out / "keys", max(options.honest, RL_MINERS), max(*hostile, team_keys, 1))
    # the LM runs play every attack but those that need an RL run (played in their own swarms): a
    # hostile process of an LM run handed 'rl-fabricated' crashed (the 45% run's rotation reaches it)
    names = tuple(a for a in attacks.ATTACKS if attacks.SCENARIOS.get(a, "lm") == "lm" and a not in attacks.STANDBY)
    reports = []
    _say(f"clean run: {options.honest} honest miners, {options.rounds} rounds (logs in {out})")
    reports.append(
        swarms.attack_run(
            out / "clean",
            keys,
            [],
            options.rounds,
            deadline=options.deadline,
            honest=options.honest,
            min_indicator_average=options.min_indicator_average,
            min_seconds=options.min_seconds,
        )
    )
    _say(_line(reports[-1]))
    for fraction, n in zip(fractions, hostile, strict=True):
        share = n / (n + options.honest)
        _say(f"{share:.0%} hostile: {n} hostile miners beside {options.honest} honest, mixed attacks")
        name = f"hostile{round(100 * fraction)}"
        # one process per hostile miner; together they walk through every attack, one step a round
        teams = [swarms.Team(f"{name}-{i}", names, 1, rotate=True, offset=i, stride=n) for i in range(n)]
        run = swarms.attack_run(
            out / name, keys, teams, options.rounds, deadline=options.deadline, honest=options.honest,
            min_indicator_average=options.min_indicator_average, hostile_nice=options.hostile_nice,
            min_seconds=options.min_seconds, hostile_after_honest=True,
        )  # fmt: skip
        reports.append(run)
        _say(_line(reports[-1]))
    cleans = {"lm": reports[0]}
    scenario_reports: list[tuple[Scenario, swarms.RunReport]] = []
    chosen = set(options.scenarios.split(","))
    for scenario in [sc for sc in SCENARIO_RUNS if sc.name in chosen and not options.skip_scenarios]:
        if scenario.task not in cleans:
            _say(
                f"clean {scenario.task} run: {RL_MINERS} miners, {RL_WORKERS} rollout workers, {options.rounds} rounds"
            )
            cleans[scenario.task] = _scenario_run(out, keys, Scenario(f"{scenario.task}-clean", scenario.task), options)
            _say(_line(cleans[scenario.task]))
        _say(f"{scenario.name}: {scenario.does or attacks.ATTACKS[scenario.name].does}")
        scenario_reports.append((scenario, _scenario_run(out, keys, scenario, options)))
        _say(_line(scenario_reports[-1][1]))
    faults = None
    if not options.skip_faults:
        _say(f"faults: {max(options.fault_rounds, 9)} rounds with every fault in one swarm")
        faults = swarms.fault_run(out / "faults", keys, max(options.fault_rounds, 9), deadline=options.deadline)
        _say(_line(faults))
    namespaces = None if options.skip_netns else _netns(out, keys, options)
    return _result(options, reports, faults, hostile, out, namespaces, cleans, scenario_reports)


def _scenario_run(out: Path, keys: swarms.Keys, scenario: Scenario, options: Options) -> swarms.RunReport:
    rl = scenario.task == "rl"
    return swarms.attack_run(
        out / scenario.name,
        keys,
        list(scenario.teams),
        options.rounds,
        deadline=options.rl_deadline if rl else options.deadline,
        honest=RL_MINERS if rl else options.honest,
        task=scenario.task,
        fabricators=scenario.fabricators,
        workers=RL_WORKERS,
        min_indicator_average=options.min_indicator_average,
        standby=scenario.standby,
        hostile_nice=options.hostile_nice if scenario.hostile_nice is None else scenario.hostile_nice,
        min_seconds=options.min_seconds,
        hostile_after_honest=scenario.after_honest,
    )


def _netns(out: Path, keys: swarms.Keys, options: Options) -> dict[str, Any]:
    """The swarm across two network namespaces (two hosts), where this machine allows it."""
    reason = netns.available()
    if reason is not None:
        _say(f"no swarm across network namespaces: {reason}")
        return {"ran": False, "reason": reason}
    _say("two hosts: validator in one network namespace, miners and a follower in another")
    report = netns.netns_run(out / "netns", keys, min(options.rounds, 5), deadline=options.deadline)
    _say(_line(report))
    return {
        "ran": True,
        "rounds": len(report.ledger.rounds),
        "hashes_agree": report.hashes_agree,
        "crashes": len(report.crashes),
        "checks": report.checks,
        "final_loss": report.final_loss,
    }


def _decide_cell(m: dict[str, Any]) -> str:
    if m["validator_decide_seconds"] is None:
        return "-"
    ratio = "" if m["validator_decide_ratio"] is None else f" ({m['validator_decide_ratio']:.1f}x)"
    return f"{m['validator_decide_seconds']:.2f}{ratio}"


def _line(report: swarms.RunReport) -> str:
    measure = f"final loss {report.final_loss}" if report.final_reward is None else f"reward {report.final_reward}"
    return (
        f"{report.name}: {len(report.ledger.rounds)} rounds in {report.seconds:.0f}s, {measure}, "
        f"honest aggregated {report.honest_per_round:.2f} a round, validator {report.validator_peak_mb} MB "
        f"peak, {report.validator_disk_mb} MB disk, aggregated hostile {report.ledger.aggregated()}, "
        f"unaccounted {report.ledger.unaccounted}, crashes {report.crashes}, checks {report.checks}"
    )


def _against(report: swarms.RunReport, clean: swarms.RunReport) -> dict[str, Any]:
    """A run under attack against the clean run of its task."""
    decide, clean_decide = report.validator_decide_seconds, clean.validator_decide_seconds
    return {
        "rounds_completed": report.rounds_completed,
        "rounds_completed_ratio": report.rounds_completed / max(clean.rounds_completed, 1),
        "honest_aggregated_per_round": round(report.honest_per_round, 3),
        "honest_aggregated_ratio": round(report.honest_per_round / clean.honest_per_round, 3)
        if clean.honest_per_round
        else None,
        "validator_decide_seconds": None if decide is None else round(decide, 3),
        "validator_decide_ratio": round(decide / clean_decide, 2) if decide is not None and clean_decide else None,
        "validator_peak_mb": report.validator_peak_mb,
        "validator_disk_mb": report.validator_disk_mb,
        "final_state_hashes": report.hashes,
        "hashes_agree": report.hashes_agree,
    }


def _result(
    options: Options,
    reports: list[swarms.RunReport],
    faults: swarms.RunReport | None,
    hostile: list[int],
    out: Path,
    netns: dict[str, Any] | None,
    cleans: dict[str, swarms.RunReport],
    scenarios: list[tuple[Scenario, swarms.RunReport]],
) -> BenchResult:
    extra_cleans = [r for task, r in cleans.items() if task != "lm"]
    one_attack = [r for _, r in scenarios]
    under_attack = [(r, reports[0]) for r in reports[1:]] + [(r, cleans[sc.task]) for sc, r in scenarios]
    attacked = [r for r, _ in under_attack]
    everything = [*reports, *extra_cleans, *one_attack, *([faults] if faults is not None else [])]
    per_run = {r.name: _against(r, clean) for r, clean in [(c, c) for c in cleans.values()] + under_attack}
    played = [*reports, *one_attack]  # every run with hostile keys, each once (`attacked` repeats reports[1:])
    merged: dict[str, dict[str, Any]] = {}
    for report in played:
        for attack, row in report.ledger.per_attack().items():
            into = merged.setdefault(attack, {k: 0 for k in row if k != "reason"} | {"reason": row["reason"]})
            for k, v in row.items():
                if k == "rounds_until_excluded":
                    into[k] = max(into[k], v)
                elif k != "reason":
                    into[k] += v
    fault_checks = {k: v for k, v in faults.checks.items() if ":" in k} if faults is not None else {}
    faults_by_name: dict[str, list[bool]] = {}  # a fault is recovered when every check of it holds
    for check, ok in fault_checks.items():
        faults_by_name.setdefault(check.split(":")[0], []).append(ok)
    clean = reports[0].final_loss
    ratios = [v for r, _ in under_attack for v in [per_run[r.name]["honest_aggregated_ratio"]] if v is not None]
    slowdowns = [v for r, _ in under_attack for v in [per_run[r.name]["validator_decide_ratio"]] if v is not None]
    summary: dict[str, Any] = {
        "rounds_completed_ratio": min((per_run[r.name]["rounds_completed_ratio"] for r in attacked), default=None),
        "honest_aggregated_ratio": min(ratios, default=None),
        "validator_decide_ratio_max": max(slowdowns, default=None),
        "validator_peak_mb_max": max((r.validator_peak_mb or 0.0 for r in everything), default=None),
        "validator_disk_mb_max": max((r.validator_disk_mb for r in everything if r is not faults), default=None),
        "hostile_aggregated": sum(r.ledger.aggregated() for r in played),
        "hostile_aggregated_detectable": sum(r.ledger.aggregated(detectable_only=True) for r in played),
        "hostile_late": sum(m["late"] for m in merged.values()),
        "attacks_not_played": ledger.not_played(merged),
        "crashes": sum(len(r.crashes) for r in everything),
        "unaccounted_submissions": sum(r.ledger.unaccounted for r in everything),
        "final_loss_clean": clean,
        "faults_recovered": sum(all(ok) for ok in faults_by_name.values()),
        "faults_total": len(faults_by_name),
        "hashes_agree": all(r.hashes_agree for r in everything),
        "honest_miners": options.honest,
        "min_seconds": options.min_seconds,
        "hostile_nice": options.hostile_nice,
        "hostile_miners": dict(zip([r.name for r in reports[1:]], hostile, strict=True)),
        "rounds": options.rounds,
        "per_attack": merged,
        "per_run": per_run,
        "fault_checks": fault_checks,
        "seconds": {r.name: round(r.seconds) for r in everything},
        "logs": str(out),
        "netns": netns,
    }
    for report, fraction in zip(reports[1:], options.hostile_fractions, strict=True):
        key = f"final_loss_{round(100 * fraction)}"
        summary[key] = report.final_loss
        if clean and report.final_loss is not None:
            summary[f"{key}_vs_clean"] = report.final_loss / clean - 1
    rows = [
        [
            a,
            attacks.ATTACKS[a].detectable,
            m["sends"],
            m["refused"] + m["rejected"] + m["held"],
            m["late"],
            m["outscored"],
            m["aggregated"],
            m["rounds_until_excluded"],
            m["unaccounted"] + m["breached"],  # a network attack whose defence failed
        ]
        for a, m in merged.items()
    ]
    run_rows = [
        [
            name,
            m["rounds_completed"],
            f"{m['rounds_completed_ratio']:.2f}",
            m["honest_aggregated_per_round"],
            "-" if m["honest_aggregated_ratio"] is None else f"{m['honest_aggregated_ratio']:.2f}",
            _decide_cell(m),
            m["validator_peak_mb"] if m["validator_peak_mb"] is not None else "-",
            m["validator_disk_mb"],
            m["hashes_agree"],
        ]
        for name, m in per_run.items()
    ]
    tables = [
        table(
            "Runs against their clean run",
            RUN_COLUMNS,
            run_rows,
        ),
        table("Attacks (30%, 45% and one-attack runs together)", ATTACK_COLUMNS, rows),
        table(
            "Why (the first reason logged for each attack)",
            ["attack", "reason"],
            [[a, m["reason"][:100]] for a, m in merged.items()],
        ),
        table(
            "Runs",
            ["run", "rounds", "final loss", "vs clean", "hostile aggregated", "unaccounted", "crashes", "hashes agree"],
            [
                [
                    r.name,
                    len(r.ledger.rounds),
                    r.final_loss if r.final_loss is not None else "-",
                    f"{r.final_loss / clean - 1:+.2%}" if clean and r.final_loss and r in reports else "-",
                    r.ledger.aggregated(),
                    r.ledger.unaccounted,
                    len(r.crashes),
                    r.hashes_agree,
                ]
                for r in everything
            ],
        ),
    ]
    if fault_checks:
        tables.append(table("Faults", ["fault", "recovered"], [[k, v] for k, v in fault_checks.items()]))
    _say(json.dumps({k: v for k, v in summary.items() if k != "per_attack"}))
    return BenchResult(summary, tables)
