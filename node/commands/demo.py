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
from typing import Any

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from node.commands.argtypes import at_least, port, positive_seconds
from node.commands.roles import DEFAULT_CONFIG, RL_CONFIG, no_cuda
from node.events import EventLog, read_events
from node.events.models import Baseline, RoundClosed
from node.run.manifest import load_manifest
from node.swarm.demo import Swarm, fresh_output, plot, prepare, summarize
from protocol.errors import ConfigError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo", help="run a whole swarm on loopback and report on it")
    parser.add_argument("--task", choices=("lm", "rl"), default="lm", help="language modelling or RL (%(default)s)")
    parser.add_argument("--miners", type=at_least(1), default=3, help="miner processes (%(default)s)")
    parser.add_argument("--followers", type=at_least(0), default=None, help="follower processes (1; 2 workers for rl)")
    parser.add_argument("--rounds", type=at_least(1), default=12, help="rounds to run (%(default)s)")
    parser.add_argument("--out", type=Path, default=Path("pulse-demo"), help="report folder (%(default)s)")
    parser.add_argument("--config", type=Path, default=None, help="base manifest (configs/tiny.toml; rl.toml for rl)")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where miners train and the validator evaluates"
    )
    parser.add_argument("--timeout", type=positive_seconds, default=900.0, help="give up after this many seconds")
    parser.add_argument("--json", action="store_true", help="print the JSON summary instead of the table")
    parser.add_argument(
        "--dashboard", type=port, metavar="PORT", help="also serve the live run page (`pulse dashboard`) on this port"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = args.config or (RL_CONFIG if args.task == "rl" else DEFAULT_CONFIG)
    try:
        base = load_manifest(config)
    except ConfigError as exc:
        print(f"pulse demo: {exc}", file=sys.stderr)
        return 2
    if (missing := no_cuda(args.device)) is not None:
        print(f"pulse demo: {missing}", file=sys.stderr)
        return 2
    if base.task != args.task:
        print(f"pulse demo: {config} is a task '{base.task}' manifest, not '{args.task}'", file=sys.stderr)
        return 2
    followers = args.followers if args.followers is not None else (2 if args.task == "rl" else 1)
    out: Path = args.out
    fresh_output(out)  # a new run: fresh keys, so nothing of the last one (either task) stays
    manifest, validator_key, miner_keys = prepare(out, base, args.miners)
    swarm = Swarm(out, manifest, args.rounds, device=args.device)
    console = Console(stderr=args.json)
    ok = False
    previous = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:  # on any way out (a role that did not start, Ctrl+C, kill), `stop_all` reaps every role
        swarm.start_bootstrap()
        if args.dashboard is not None:
            _, url = swarm.start_dashboard(args.dashboard)
            console.print(f"live run page: {url}")
        validator = swarm.start_role("validator", "validator", validator_key, state_dir=out / "validator")
        workers = [swarm.start_role(f"miner{i}", "miner", key) for i, key in enumerate(miner_keys)]
        workers += [swarm.start_role(f"follower{i}" if i else "follower", "follow", None) for i in range(followers)]
        deadline = time.monotonic() + args.timeout
        with Live(
            _table(EventLog([]), args.rounds), console=console, refresh_per_second=2, transient=args.json
        ) as live:
            while time.monotonic() < deadline:
                live.update(_table(read_events(out / "events"), args.rounds))
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
    summary = summarize(read_events(out / "events"), args.rounds)
    summary["clean_shutdown"] = not swarm.unclean  # every role exited on Ctrl+C, daemons included
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if summary["rounds"]:
        plot(summary, out)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        rl = args.task == "rl"
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
    good = ok and summary["hashes_agree"] and summary["rounds"] == args.rounds
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
