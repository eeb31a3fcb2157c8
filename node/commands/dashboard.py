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

from pydantic import Field

from node.commands.argtypes import Port, PositiveSeconds
from node.commands.options import add_options, parsed
from node.commands.roles import DEFAULT_CONFIG, start_run_reader, until_signal
from node.net.netconfig import NetOptions
from node.net.p2ppeer import DHTView
from node.net.peer import RunView
from node.roles.dashboard.board import RunFacts
from node.roles.dashboard.server import DashboardServer
from node.roles.dashboard.watch import Watcher
from node.roles.records import run_records
from node.run.manifest import Manifest


class DashboardOptions(NetOptions):
    """`pulse dashboard`'s options, the network's flags among them."""

    config: Path = DEFAULT_CONFIG
    """run manifest TOML"""
    port: Port = 8470
    """HTTP port, 0 for any free port"""
    bind: str = "127.0.0.1"
    """HTTP address to listen on"""
    poll: PositiveSeconds = 2.0
    """seconds between DHT reads"""
    refresh: PositiveSeconds = 3.0
    """seconds between page reloads"""
    history: int = Field(default=1000, ge=1)
    """rounds read back at start-up"""


def register(subparsers: Any) -> None:
    text = "serve a live web page for the run: rounds, loss, leaderboard, bytes, nodes online"
    parser = subparsers.add_parser("dashboard", help=text, description=text)
    add_options(parser, DashboardOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (options := parsed(DashboardOptions, args, "dashboard")) is None:
        return 2
    if (started := start_run_reader(options.config, options, "dashboard")) is None:
        return 2
    manifest, dht = started
    try:
        return asyncio.run(_main(DHTView(dht, run_records(manifest)), manifest, options))
    except OSError as exc:  # the port is taken
        print(f"pulse dashboard: {exc}", file=sys.stderr)
        return 2
    finally:
        dht.shutdown()


async def _main(view: RunView, manifest: Manifest, options: DashboardOptions) -> int:
    facts = RunFacts(
        name=manifest.name,
        run_id=manifest.run_id,
        validators=frozenset(manifest.validators),
        deadline_seconds=manifest.round.deadline_seconds,
        task=manifest.task,
    )
    watcher = Watcher(view, facts, history=options.history)
    server = DashboardServer(watcher.board, host=options.bind, port=options.port, refresh=options.refresh)
    print(f"pulse dashboard: run {manifest.run_id[:16]}... at {server.start()}", flush=True)
    try:
        await until_signal(watcher.run_forever(options.poll))
    finally:
        server.stop()
    return 0
