"""attacks: the attack and fault campaign against real loopback swarms.

Runs, with the tiny preset and the same keys throughout: a clean run (the honest miners alone),
the same honest miners with 30% and with 45% hostile miners (each hostile key plays a different
attack every round, so every attack is met), then one swarm with every fault. The campaign's code
(hostile miner processes, payload crafting, the ledger) is `node/swarm/campaign/`.

Figures: `hostile_aggregated` (hostile pushes aggregated, all runs; `hostile_aggregated_detectable`
counts only attacks visible in the payload), `crashes` (validator or honest processes that exited
non-zero), `unaccounted_submissions` (pushes or received submissions without exactly one logged
outcome, rounds closed twice, network attacks whose defence failed), `final_loss_*` (the
validator's held-out loss after the last round), `faults_recovered` / `faults_total`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from node.bench.report import BenchResult, table
from node.swarm.campaign import attacks, netns, swarms

ATTACK_COLUMNS = [
    "attack",
    "detectable",
    "pushes",
    "rejected",
    "outscored",
    "aggregated",
    "rounds until excluded",
    "unaccounted",
]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--honest", type=int, default=7, help="honest miners in every run")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per attack run")
    parser.add_argument("--fault-rounds", type=int, default=9, help="rounds of the fault run (at least 9)")
    parser.add_argument("--deadline", type=float, default=20.0, help="round deadline in seconds")
    parser.add_argument("--fractions", default="0.30,0.45", help="hostile fractions of all miners")
    parser.add_argument("--skip-faults", action="store_true")
    parser.add_argument("--skip-netns", action="store_true", help="skip the swarm across two network namespaces")
    parser.add_argument("--out", type=Path, help="keep the runs' logs here (default: a temporary folder)")


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> BenchResult:
    fractions = [float(f) for f in args.fractions.split(",") if f]
    hostile = [max(1, math.ceil(f * args.honest / (1 - f) - 1e-9)) for f in fractions]
    out = args.out or Path(tempfile.mkdtemp(prefix="pulse-bench-attacks-"))
    keys = swarms.Keys.make(out / "keys", honest=args.honest, hostile=max(hostile, default=1))
    names = tuple(attacks.ATTACKS)
    reports = []
    _say(f"clean run: {args.honest} honest miners, {args.rounds} rounds (logs in {out})")
    reports.append(swarms.attack_run(out / "clean", keys, [], args.rounds, deadline=args.deadline))
    _say(_line(reports[-1]))
    for fraction, n in zip(fractions, hostile, strict=True):
        share = n / (n + args.honest)
        _say(f"{share:.0%} hostile: {n} hostile miners beside {args.honest} honest, mixed attacks")
        name = f"hostile{round(100 * fraction)}"
        # one process per hostile miner; together they walk through every attack, one step a round
        teams = [swarms.Team(f"{name}-{i}", names, 1, rotate=True, offset=i, stride=n) for i in range(n)]
        reports.append(swarms.attack_run(out / name, keys, teams, args.rounds, deadline=args.deadline))
        _say(_line(reports[-1]))
    faults = None
    if not args.skip_faults:
        _say(f"faults: {max(args.fault_rounds, 9)} rounds with every fault in one swarm")
        faults = swarms.fault_run(out / "faults", keys, max(args.fault_rounds, 9), deadline=args.deadline)
        _say(_line(faults))
    namespaces = None if args.skip_netns else _netns(out, keys, args)
    return _result(args, reports, faults, hostile, out, namespaces)


def _netns(out: Path, keys: swarms.Keys, args: argparse.Namespace) -> dict[str, Any]:
    """The swarm across two network namespaces (two hosts), where this machine allows it."""
    reason = netns.available()
    if reason is not None:
        _say(f"no swarm across network namespaces: {reason}")
        return {"ran": False, "reason": reason}
    _say("two hosts: validator in one network namespace, miners and a follower in another")
    report = netns.netns_run(out / "netns", keys, min(args.rounds, 5), deadline=args.deadline)
    _say(_line(report))
    return {
        "ran": True,
        "rounds": len(report.ledger.rounds),
        "hashes_agree": report.hashes_agree,
        "crashes": len(report.crashes),
        "checks": report.checks,
        "final_loss": report.final_loss,
    }


def _line(report: swarms.RunReport) -> str:
    return (
        f"{report.name}: {len(report.ledger.rounds)} rounds in {report.seconds:.0f}s, final loss {report.final_loss}, "
        f"aggregated hostile {report.ledger.aggregated()}, unaccounted {report.ledger.unaccounted}, "
        f"crashes {report.crashes}, checks {report.checks}"
    )


def _result(
    args: argparse.Namespace,
    reports: list[swarms.RunReport],
    faults: swarms.RunReport | None,
    hostile: list[int],
    out: Path,
    netns: dict[str, Any] | None,
) -> BenchResult:
    everything = [*reports, *([faults] if faults is not None else [])]
    merged: dict[str, dict[str, Any]] = {}
    for report in reports:
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
    summary: dict[str, Any] = {
        "hostile_aggregated": sum(r.ledger.aggregated() for r in reports),
        "hostile_aggregated_detectable": sum(r.ledger.aggregated(detectable_only=True) for r in reports),
        "crashes": sum(len(r.crashes) for r in everything),
        "unaccounted_submissions": sum(r.ledger.unaccounted for r in everything),
        "final_loss_clean": clean,
        "faults_recovered": sum(all(ok) for ok in faults_by_name.values()),
        "faults_total": len(faults_by_name),
        "hashes_agree": all(r.hashes_agree for r in everything),
        "honest_miners": args.honest,
        "hostile_miners": dict(zip([r.name for r in reports[1:]], hostile, strict=True)),
        "rounds": args.rounds,
        "per_attack": merged,
        "fault_checks": fault_checks,
        "seconds": {r.name: round(r.seconds) for r in everything},
        "logs": str(out),
        "netns": netns,
    }
    for report, fraction in zip(reports[1:], args.fractions.split(","), strict=True):
        key = f"final_loss_{round(100 * float(fraction))}"
        summary[key] = report.final_loss
        if clean and report.final_loss is not None:
            summary[f"{key}_vs_clean"] = report.final_loss / clean - 1
    rows = [
        [
            a,
            attacks.ATTACKS[a].detectable,
            m["sends"],
            m["refused"] + m["rejected"],
            m["outscored"],
            m["aggregated"],
            m["rounds_until_excluded"],
            m["unaccounted"] + m["breached"],  # a network attack whose defence failed
        ]
        for a, m in merged.items()
    ]
    tables = [
        table("Attacks (30% and 45% runs together)", ATTACK_COLUMNS, rows),
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
