"""`pulse dht`: run a long-lived DHT peer that others dial first, and print its multiaddrs."""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from typing import Any

from node.net.dht import PulseDHT
from node.net.netconfig import add_net_arguments, net_config_from_args
from protocol.errors import ConfigError, NetworkError
from protocol.identity import Identity


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("dht", help="run a bootstrap DHT peer and print its multiaddrs")
    parser.add_argument("--run-id", required=True, type=_run_id, help="the run's id (64 hex, hash of its manifest)")
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
        dht = PulseDHT.start(config, run_id=args.run_id, identity=Identity.generate())
    except (ConfigError, NetworkError) as exc:
        print(f"pulse dht: {exc}", file=sys.stderr)
        return 2
    try:
        print(f"pulse dht: run {args.run_id[:16]}..., peer id {dht.peer_id}; others join with --initial-peers:")
        for addr in dht.visible_maddrs():
            print(addr)
        print("ready (Ctrl-C to stop)", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()
    finally:
        dht.shutdown()
    return 0
