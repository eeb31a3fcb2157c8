"""`pulse demo [--task lm|rl] [--miners N] [--rounds R] [--device cpu|cuda] [--out DIR] [--json]`: a loopback
swarm (`demo.py`).

`--task rl` runs the RL preset (`configs/rl.toml`): followers are inference workers publishing
rollouts, miners train GRPO on them, and the table shows the held-out reward per round.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from node.commands.argtypes import Port, PositiveSeconds
from node.commands.options import OPTIONS, add_options, options_from
from node.commands.roles import DEFAULT_CONFIG, RL_CONFIG, no_cuda
from node.events import EventLog, read_events
from node.events.models import Baseline, RoundClosed
from node.run.manifest import load_manifest
from node.swarm.demo import Swarm, fresh_output, plot, prepare, summarize
from protocol.errors import ConfigError


class DemoOptions(BaseModel):
    """`pulse demo`'s options."""

    model_config = OPTIONS

    task: Literal["lm", "rl"] = "lm"
    """language modelling or RL"""
    miners: int = Field(default=3, ge=1)
    """miner processes"""
    followers: int | None = Field(default=None, ge=0)
    """follower processes (1; 2 workers for rl)"""
    rounds: int = Field(default=12, ge=1)
    """rounds to run"""
    out: Path = Path("pulse-demo")
    """report folder"""
    config: Path | None = None
    """base manifest (configs/tiny.toml; rl.toml for rl)"""
    device: Literal["cpu", "cuda"] = "cpu"
    """where miners train and the validator evaluates"""
    timeout: PositiveSeconds = 900.0
    """give up after this many seconds"""
    print_json: bool = Field(default=False, alias="json")
    """print the JSON summary instead of the table"""
    dashboard: Port | None = None
    """also serve the live run page (`pulse dashboard`) on this port"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo", help="run a whole swarm on loopback and report on it")
    add_options(parser, DemoOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from(DemoOptions, args)
    except ConfigError as exc:
        print(f"pulse demo: {exc}", file=sys.stderr)
        return 2
    return demo(options)


def demo(options: DemoOptions) -> int:
    """Run the swarm `options` asks for, drawing the live table, then write and print the report."""
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
    followers = options.followers if options.followers is not None else (2 if options.task == "rl" else 1)
    out: Path = options.out
    fresh_output(out)  # a new run: fresh keys, so nothing of the last one (either task) stays
    manifest, validator_key, miner_keys = prepare(out, base, options.miners)
    swarm = Swarm(out, manifest, options.rounds, device=options.device)
    console = Console(stderr=options.print_json)
    ok = False
    previous = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:  # on any way out (a role that did not start, Ctrl+C, kill), `stop_all` reaps every role
        swarm.start_bootstrap()
        if options.dashboard is not None:
            _, url = swarm.start_dashboard(options.dashboard)
            console.print(f"live run page: {url}")
        validator = swarm.start_role("validator", "validator", validator_key, state_dir=out / "validator")
        workers = [swarm.start_role(f"miner{i}", "miner", key) for i, key in enumerate(miner_keys)]
        workers += [swarm.start_role(f"follower{i}" if i else "follower", "follow", None) for i in range(followers)]
        deadline = time.monotonic() + options.timeout
        with Live(
            _table(EventLog([]), options.rounds), console=console, refresh_per_second=2, transient=options.print_json
        ) as live:
            while time.monotonic() < deadline:
                live.update(_table(read_events(out / "events"), options.rounds))
                if all(w.popen.poll() is not None for w in workers):
                    break
                if validator.popen.poll() not in (None, 0):  # it failed; after its last round it stops by itself
                    break
                time.sleep(0.5)
        ok = all(w.popen.poll() == 0 for w in workers)
    except RuntimeError as exc:  # a role did not start: say which, after everyone is stopped
        print(f"pulse demo: {exc}", file=sys.stderr)
    finally:
        swarm.stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = summarize(read_events(out / "events"), options.rounds)
    summary["clean_shutdown"] = not swarm.unclean  # every role exited on Ctrl+C, daemons included
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if summary["rounds"]:
        plot(summary, out)
    if options.print_json:
        print(json.dumps(summary, indent=2))
    else:
        rl = options.task == "rl"
        curve = "reward.png" if rl else "loss.png"
        console.print(
            f"report: {out}/summary.json, {out}/{curve}, {out}/bytes.png, {out}/leaderboard.png; logs in {out}/logs"
        )
        console.print(f"the model: pulse export --state-dir {out}/validator --config {out}/run.toml --out {out}/model")
        if not summary["rounds"]:
            console.print("no round completed")
        else:
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
    good = ok and summary["hashes_agree"] and summary["rounds"] == options.rounds
    return 0 if good else 1


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through `finally`, as Ctrl+C does


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
