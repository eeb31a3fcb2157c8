"""`pulse status --config C --initial-peers ...`: the run's round, who is active, the latest scores."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from node.commands.roles import DEFAULT_CONFIG
from node.net.dht import PulseDHT
from node.net.netconfig import add_net_arguments, net_config_from_args
from node.run.manifest import load_manifest
from protocol.errors import ConfigError, NetworkError
from protocol.identity import Identity
from protocol.messages import Heartbeat, RoundResult, SubmissionHeader


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("status", help="show the run's current round, active nodes and latest scores")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="run manifest TOML (%(default)s)")
    add_net_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        manifest = load_manifest(args.config)
        dht = PulseDHT.start(net_config_from_args(args), run_id=manifest.run_id, identity=Identity.generate())
    except (ConfigError, NetworkError) as exc:
        print(f"pulse status: {exc}", file=sys.stderr)
        return 2
    try:
        show(dht, set(manifest.validators), Console())
    finally:
        dht.shutdown()
    return 0


def latest_result(dht: PulseDHT, validators: set[str]) -> tuple[int, RoundResult | None]:
    """(last round with a validator result or -1, that result): exponential then binary search."""

    def result(r: int) -> RoundResult | None:
        return next((v.message for v in dht.get(RoundResult, r) if v.sender_hex in validators), None)

    if (found := result(0)) is None:
        return -1, None
    lo, step = 0, 1
    while result(lo + step) is not None:
        lo, step = lo + step, step * 2
    hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if result(mid) is not None else (lo, mid)
    return lo, result(lo) or found


def show(dht: PulseDHT, validators: set[str], console: Console) -> None:
    last, result = latest_result(dht, validators)
    current = last + 1
    console.print(f"run {dht.run_id[:16]}...: round {current} is the open round ({last + 1} rounds completed)")
    beats = [*dht.get(Heartbeat, current), *dht.get(Heartbeat, last)] if last >= 0 else dht.get(Heartbeat, 0)
    active = Table(title="active nodes (heartbeats of the last two rounds)")
    for col in ("role", "key", "round", "state", "seen"):
        active.add_column(col)
    seen: set[str] = set()
    for v in beats:
        if v.sender_hex in seen:
            continue
        seen.add(v.sender_hex)
        b = v.message
        ago = f"{max(0, int(time.time()) - b.sent_at)} s ago"
        active.add_row(b.role, v.sender_hex[:12], str(b.round), (b.state_hash or "-")[:12], ago)
    console.print(active)
    headers = dht.get(SubmissionHeader, current)
    console.print(f"round {current}: {len(headers)} submission headers in the DHT so far")
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
