"""`pulse demo [--miners N] [--rounds R] [--out DIR] [--json]`: a local swarm on loopback (see `demo.py`)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from node.demo import Swarm, plot, prepare, read_events, summarize
from node.manifest import load_manifest
from node.roles_command import DEFAULT_CONFIG
from protocol.errors import ConfigError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo", help="run a whole swarm on loopback and report on it")
    parser.add_argument("--miners", type=int, default=3, help="miner processes (%(default)s)")
    parser.add_argument("--rounds", type=int, default=12, help="rounds to run (%(default)s)")
    parser.add_argument("--out", type=Path, default=Path("pulse-demo"), help="report folder (%(default)s)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="base manifest (%(default)s)")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    parser.add_argument("--json", action="store_true", help="print the JSON summary instead of the table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        base = load_manifest(args.config)
    except ConfigError as exc:
        print(f"pulse demo: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    shutil.rmtree(out / "work", ignore_errors=True)
    shutil.rmtree(out / "events", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    manifest, validator_key, miner_keys = prepare(out, base, args.miners)
    swarm = Swarm(out, manifest, args.rounds)
    console = Console(stderr=args.json)
    ok = False
    try:
        swarm.start_bootstrap()
        validator = swarm.start_role("validator", "validator", validator_key)
        workers = [swarm.start_role(f"miner{i}", "miner", key) for i, key in enumerate(miner_keys)]
        workers.append(swarm.start_role("follower", "follow", None))
        deadline = time.monotonic() + args.timeout
        with Live(_table([], args.rounds), console=console, refresh_per_second=2, transient=args.json) as live:
            while time.monotonic() < deadline:
                live.update(_table(read_events(out / "events"), args.rounds))
                if all(w.popen.poll() is not None for w in workers) or validator.popen.poll() is not None:
                    break
                time.sleep(0.5)
        ok = all(w.popen.poll() == 0 for w in workers)
    finally:
        swarm.stop_all()
    summary = summarize(read_events(out / "events"), args.rounds)
    summary["clean_shutdown"] = not swarm.unclean  # every role exited on Ctrl+C, daemons included
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if summary["rounds"]:
        plot(summary, out)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        console.print(f"report: {out}/summary.json, {out}/loss.png, {out}/bytes.png; logs in {out}/logs")
        console.print(
            f"{summary['rounds']} rounds, loss {summary['loss_first']} -> {summary['loss_last']}, "
            f"hashes agree: {summary['hashes_agree']}, {summary['bytes_ratio_vs_dense']:.0f}x fewer bytes than dense"
            if summary["rounds"]
            else "no round completed"
        )
    good = ok and summary["hashes_agree"] and summary["rounds"] == args.rounds
    return 0 if good else 1


def _table(records: list[dict[str, Any]], rounds: int) -> Table:
    table = Table(title=f"pulse demo: {rounds} rounds on loopback")
    for col in ("round", "held-out loss", "submissions", "selected", "sent", "vs dense", "patch", "scores"):
        table.add_column(col, justify="right" if col != "scores" else "left")
    names = {r["sender"]: r["name"] for r in records if r["event"] == "start" and "sender" in r}
    for r in records:
        if r["event"] != "round":
            continue
        scores = ", ".join(
            f"{names.get(k, k[:8])} {v:.3g}" for k, v in sorted(r["scores"].items(), key=lambda kv: -kv[1])
        )
        table.add_row(
            str(r["round"]),
            f"{r['loss']:.4f}" if r.get("loss") is not None else "-",
            str(r["submissions"]),
            str(r["selected"]),
            f"{r['bytes'] / 1e3:.1f} kB",
            f"{r['dense_bytes'] / max(r['bytes'], 1):.0f}x smaller",
            f"{r['patch_bytes'] / 1e3:.1f} kB",
            scores or "-",
        )
    return table
