"""`pulse dht`: run a long-lived DHT peer that others dial first, and print its multiaddrs.

It stores and serves the run's records under the same rules as every other peer, so it needs
the run's validator keys: `--config run.toml` (the run id and validators come from the manifest),
or `--run-id` with `--validators`. With `--run-id` alone it knows no validator, and so stores no
record that only validators may write (results, checkpoints): the other peers hold those.
If its DHT process dies it starts another (the same peer id with `--p2p-identity`).

With `--metrics-port` it serves Prometheus metrics too: the peers it knows and its process's figures.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from node.commands.roles import add_metrics_arguments, start_metrics
from node.net.dht import PulseDHT
from node.net.netconfig import add_net_arguments, net_config_from_args
from node.net.records import RecordRules
from node.run.manifest import load_manifest
from protocol.errors import ConfigError, NetworkError
from protocol.identity import Identity

WATCH_SECONDS = 5.0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("dht", help="run a bootstrap DHT peer and print its multiaddrs")
    run = parser.add_mutually_exclusive_group(required=True)
    run.add_argument("--config", type=Path, help="the run manifest (gives the run id and its validators)")
    run.add_argument("--run-id", type=_hex64, help="the run's id (64 hex, hash of its manifest)")
    parser.add_argument("--validators", nargs="*", default=[], type=_hex64, metavar="KEY", help="with --run-id")
    add_metrics_arguments(parser)
    add_net_arguments(parser)
    parser.set_defaults(func=run_dht)


def _hex64(text: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise argparse.ArgumentTypeError("expected 64 lowercase hex characters")
    return text


def rules_from_args(args: argparse.Namespace) -> RecordRules:
    if args.config is not None:
        if args.validators:
            raise ConfigError("--validators goes with --run-id; --config names the validators itself")
        manifest = load_manifest(args.config)
        return RecordRules(manifest.run_id, tuple(manifest.validators))
    return RecordRules(args.run_id, tuple(args.validators))


def run_dht(args: argparse.Namespace) -> int:
    try:
        config = net_config_from_args(args)
        rules = rules_from_args(args)
        # The bootstrap signs nothing; it only stores and serves records, so any key will do.
        identity = Identity.generate()
        dht = PulseDHT.start(config, rules, identity)
    except (ConfigError, NetworkError) as exc:
        print(f"pulse dht: {exc}", file=sys.stderr)
        return 2
    try:
        metrics = start_metrics(args, "dht", "bootstrap", rules.run_id, identity.public_hex)
    except OSError as exc:
        print(f"pulse dht: --metrics-port {args.metrics_port}: {exc}", file=sys.stderr)
        dht.shutdown()
        return 2
    if metrics is not None:
        metrics.watch_peers(dht.known_peers)
    try:
        if not rules.validators:
            print("pulse dht: no validator keys given: records only validators write are not stored here")
        print(f"pulse dht: run {rules.run_id[:16]}..., peer id {dht.peer_id}; others join with --initial-peers:")
        for addr in dht.visible_maddrs():
            print(addr)
        print("ready (Ctrl-C to stop)", flush=True)
        stop = threading.Event()
        # SIGINT too: a shell script's `pulse dht &` starts with SIGINT ignored, and Python then never
        # turns it into KeyboardInterrupt, so Ctrl-C (or kill -INT) did nothing
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(WATCH_SECONDS):
            if not dht.alive:
                dht.restart()
                print(f"pulse dht: restarted; peer id {dht.peer_id}", flush=True)
    except NetworkError as exc:
        print(f"pulse dht: {exc}", file=sys.stderr)
        return 1
    finally:
        if metrics is not None:
            metrics.close()
        dht.shutdown()
    return 0
