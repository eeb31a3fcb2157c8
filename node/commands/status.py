"""`pulse status --config C --initial-peers ...`: the run's round, who is active, the latest scores.

Joins the DHT (no blob streams), reads `node.roles.status.read_status` and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from node.commands.options import add_options, parsed
from node.commands.roles import DEFAULT_CONFIG, start_run_reader
from node.net.netconfig import NetOptions
from node.net.p2ppeer import DHTView
from node.roles.records import run_records
from node.roles.status import RunStatus, read_status


class StatusOptions(NetOptions):
    """`pulse status`'s options, the network's flags among them."""

    config: Path = DEFAULT_CONFIG
    """run manifest TOML"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("status", help="show the run's current round, active nodes and latest scores")
    add_options(parser, StatusOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (options := parsed(StatusOptions, args, "status")) is None:
        return 2
    if (started := start_run_reader(options.config, options, "status")) is None:
        return 2
    manifest, dht = started
    try:
        status = asyncio.run(read_status(DHTView(dht, run_records(manifest))))
    finally:
        dht.shutdown()
    if not status.found:
        print(
            f"pulse status: {nothing_found(manifest.run_id, bool(manifest.validators), bool(options.initial_peers))}",
            file=sys.stderr,
        )
        return 1
    show(status, Console())
    return 0


def nothing_found(run_id: str, validators: bool, peers: bool) -> str:
    """Why a node may see nothing of its run, in one line."""
    if not validators:
        return "the manifest names no validator: use the run's own manifest (--config)"
    hint = "" if peers else "; no --initial-peers were given, so this node knows no other peer"
    return (
        f"nothing of run {run_id[:16]}... found: is your manifest the validator's (run ids differ when one "
        f"byte differs), and is the run up?{hint}"
    )


def show(status: RunStatus, console: Console) -> None:
    current = status.open_round
    console.print(f"run {status.run_id[:16]}...: round {current} is the current round ({current} rounds completed)")
    active = Table(title="active nodes (heartbeats of the last two rounds)")
    for col in ("role", "key", "round", "state", "seen"):
        active.add_column(col)
    for n in status.active:
        active.add_row(n.role, n.key[:12], str(n.round), (n.state_hash or "-")[:12], f"{n.seconds_ago} s ago")
    console.print(active)
    console.print(f"round {current}: {status.headers} submission headers in the DHT so far")
    result = status.result
    if result is None:
        return
    scores = Table(title=f"round {result.round}: {len(result.selected)} aggregated, {len(result.rejections)} not")
    for col in ("miner", "outcome", "score / reason"):
        scores.add_column(col)
    for s in sorted(result.selected, key=lambda s: -s.score):
        scores.add_row(s.sender[:12], "aggregated", f"{s.score:.4g}")
    for r in result.rejections:
        scores.add_row(r.sender[:12], "not aggregated", r.reason)
    console.print(scores)
    console.print(f"patch {result.patch_size} bytes, new state {result.new_state_hash[:12]}")
