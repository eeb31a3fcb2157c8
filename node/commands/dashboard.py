"""`pulse dashboard --config C --initial-peers ... [--port P]`: a live web page for the run (`roles/dashboard/`).

It joins the run's DHT as a reader (a throwaway key; no blob streams; it signs and announces
nothing), reads the signed records every `--poll` seconds and serves the page on `--bind`:`--port`
until Ctrl+C.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from node.commands.argtypes import at_least, port, positive_seconds
from node.commands.roles import DEFAULT_CONFIG, start_run_reader, until_signal
from node.net.netconfig import add_net_arguments
from node.net.p2ppeer import DHTView
from node.net.peer import RunView
from node.roles.dashboard.board import RunFacts
from node.roles.dashboard.server import DashboardServer
from node.roles.dashboard.watch import Watcher
from node.roles.records import run_records
from node.run.manifest import Manifest


def register(subparsers: Any) -> None:
    text = "serve a live web page for the run: rounds, loss, leaderboard, bytes, nodes online"
    parser = subparsers.add_parser("dashboard", help=text, description=text)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="run manifest TOML (%(default)s)")
    parser.add_argument("--port", type=port, default=8470, help="HTTP port (%(default)s; 0: any free port)")
    parser.add_argument("--bind", default="127.0.0.1", help="HTTP address to listen on (%(default)s)")
    parser.add_argument("--poll", type=positive_seconds, default=2.0, help="seconds between DHT reads (%(default)s)")
    parser.add_argument("--refresh", type=positive_seconds, default=3.0, help="seconds between page reloads")
    parser.add_argument("--history", type=at_least(1), default=1000, help="rounds read back at start-up (%(default)s)")
    add_net_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (started := start_run_reader(args.config, args, "dashboard")) is None:
        return 2
    manifest, dht = started
    try:
        return asyncio.run(_main(DHTView(dht, run_records(manifest)), manifest, args))
    except OSError as exc:  # the port is taken
        print(f"pulse dashboard: {exc}", file=sys.stderr)
        return 2
    finally:
        dht.shutdown()


async def _main(view: RunView, manifest: Manifest, args: argparse.Namespace) -> int:
    facts = RunFacts(
        name=manifest.name,
        run_id=manifest.run_id,
        validators=frozenset(manifest.validators),
        deadline_seconds=manifest.round.deadline_seconds,
        task=manifest.task,
    )
    watcher = Watcher(view, facts, history=args.history)
    server = DashboardServer(watcher.board, host=args.bind, port=args.port, refresh=args.refresh)
    print(f"pulse dashboard: run {manifest.run_id[:16]}... at {server.start()}", flush=True)
    try:
        await until_signal(watcher.run_forever(args.poll))
    finally:
        server.stop()
    return 0
