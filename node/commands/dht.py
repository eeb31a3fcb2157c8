"""`pulse dht`: run a long-lived DHT peer that others dial first, and print its multiaddrs.

With `--metrics-port` it serves Prometheus metrics too: the peers it knows and its process's figures.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from typing import Any

from node.commands.roles import add_metrics_arguments, start_metrics
from node.net.dht import PulseDHT
from node.net.netconfig import add_net_arguments, net_config_from_args
from protocol.errors import ConfigError, NetworkError
from protocol.identity import Identity


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("dht", help="run a bootstrap DHT peer and print its multiaddrs")
    parser.add_argument("--run-id", required=True, type=_run_id, help="the run's id (64 hex, hash of its manifest)")
    add_metrics_arguments(parser)
    add_net_arguments(parser)
    parser.set_defaults(func=run)


def _run_id(text: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise argparse.ArgumentTypeError("a run id is 64 lowercase hex characters")
    return text


def run(args: argparse.Namespace) -> int:
    try:
        config = net_config_from_args(args)
        # The bootstrap signs nothing; it only stores and serves records, so any key will do.
        identity = Identity.generate()
        dht = PulseDHT.start(config, run_id=args.run_id, identity=identity)
    except (ConfigError, NetworkError) as exc:
        print(f"pulse dht: {exc}", file=sys.stderr)
        return 2
    try:
        metrics = start_metrics(args, "dht", "bootstrap", args.run_id, identity.public_hex)
    except OSError as exc:
        print(f"pulse dht: --metrics-port {args.metrics_port}: {exc}", file=sys.stderr)
        dht.shutdown()
        return 2
    if metrics is not None:
        metrics.watch_peers(dht.known_peers)
    try:
        print(f"pulse dht: run {args.run_id[:16]}..., peer id {dht.peer_id}; others join with --initial-peers:")
        for addr in dht.visible_maddrs():
            print(addr)
        print("ready (Ctrl-C to stop)", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()
    finally:
        if metrics is not None:
            metrics.close()
        dht.shutdown()
    return 0
