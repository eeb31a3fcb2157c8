"""`pulse demo [--task lm|rl] [--miners N] [--rounds R] [--device cpu|cuda] [--out DIR] [--json]`: a loopback
swarm (`node/swarm/demorun.py`'s `run_demo`); this command parses its flags, checks the manifest and
prints the live table and the report.

`--task rl` runs the RL preset (`configs/rl.toml`): followers are inference workers publishing
rollouts, miners train GRPO on them, and the table shows the held-out reward per round.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from node.commands.options import add_options, parsed
from node.commands.roles import DEFAULT_CONFIG, RL_CONFIG, no_cuda
from node.events import EventLog
from node.events.models import Baseline, RoundClosed
from node.run.manifest import load_manifest
from node.swarm.demorun import DemoOptions, run_demo
from protocol.errors import ConfigError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo", help="run a whole swarm on loopback and report on it")
    add_options(parser, DemoOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (options := parsed(DemoOptions, args, "demo")) is None:
        return 2
    config = options.config or (RL_CONFIG if options.task == "rl" else DEFAULT_CONFIG)
    try:
        base = load_manifest(config)
    except ConfigError as exc:
        print(f"pulse demo: {exc}", file=sys.stderr)
        return 2
    if (missing := no_cuda(options.device)) is not None:
        print(f"pulse demo: {missing}", file=sys.stderr)
        return 2
    if base.task != options.task:
        print(f"pulse demo: {config} is a task '{base.task}' manifest, not '{options.task}'", file=sys.stderr)
        return 2
    console = Console(stderr=options.print_json)
    table = _table(EventLog([]), options.rounds)
    with Live(table, console=console, refresh_per_second=2, transient=options.print_json) as live:
        outcome = run_demo(options, base, lambda log: live.update(_table(log, options.rounds)), console.print)
    if outcome.error is not None:
        print(f"pulse demo: {outcome.error}", file=sys.stderr)
    if options.print_json:
        print(json.dumps(outcome.summary, indent=2))
    else:
        _report(outcome.summary, options, console)
    return 0 if outcome.ok else 1


def _report(summary: dict[str, Any], options: DemoOptions, console: Console) -> None:
    out, rl = options.out, options.task == "rl"
    curve = "reward.png" if rl else "loss.png"
    console.print(
        f"report: {out}/summary.json, {out}/{curve}, {out}/bytes.png, {out}/leaderboard.png; logs in {out}/logs"
    )
    console.print(f"the model: pulse export --state-dir {out}/validator --config {out}/run.toml --out {out}/model")
    if not summary["rounds"]:
        console.print("no round completed")
        return
    progress = (
        f"reward {summary['reward_first']:.4f} -> {summary['reward_last']:.4f}, "
        f"patch density {summary['mean_patch_density']:.2%}"
        if rl
        else f"loss {summary['loss_first']:.4f} -> {summary['loss_last']:.4f}"
    )
    console.print(
        f"{summary['rounds']} rounds, {progress}, hashes agree: {summary['hashes_agree']}, "
        f"{summary['bytes_ratio_vs_dense']:.0f}x fewer bytes than dense"
    )


def _table(log: EventLog, rounds: int) -> Table:
    """One row per round, narrow enough for an 80-column terminal with a handful of miners."""
    table = Table(
        title=f"pulse demo: {rounds} rounds on loopback", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False
    )
    rl = any(e.reward is not None for e in log.events(RoundClosed)) or any(
        e.reward is not None for e in log.events(Baseline)
    )
    metric = "reward" if rl else "loss"
    for col in ("round", metric, "subm.", "agg.", "sent kB", "patch kB", "scores of the aggregated"):
        table.add_column(col, justify="right" if not col.startswith("scores") else "left", no_wrap=True)
    names = {key: name for name, key in log.keys().items()}
    for e in log.events(RoundClosed):
        ranked = sorted(e.scores.items(), key=lambda kv: -kv[1])
        scores = " ".join(f"{_short(names.get(k, k[:8]))}:{v:.2g}" for k, v in ranked)
        value = e.reward if rl else e.loss
        table.add_row(
            str(e.round),
            "-" if value is None else f"{value:.4f}",
            str(e.submissions),
            str(e.selected),
            f"{e.bytes / 1e3:.1f}",
            f"{e.patch_bytes / 1e3:.1f}",
            scores or "-",
        )
    return table


def _short(name: str) -> str:
    """miner0 -> m0: the demo's names, short enough for the scores column."""
    return re.sub(r"^miner", "m", name)
