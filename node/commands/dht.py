"""`pulse dht`: run a long-lived DHT peer that others dial first, and print its multiaddrs.

It stores and serves the run's records under the same rules as every other peer, so it needs
the run's validator keys: `--config run.toml` (the run id and validators come from the manifest),
or `--run-id` with `--validators`. With `--run-id` alone it knows no validator, and so stores no
record that only validators may write (results, checkpoints): the other peers hold those.
If its DHT process dies it starts another (the same peer id with `--p2p-identity`). Every few seconds
it reads the run's head, so that its storage knows which rounds lie beyond it (`PulseDHT.learn_head`).

With `--metrics-port` it serves Prometheus metrics too: the peers it knows and its process's figures.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from node.commands.options import add_options, options_from
from node.commands.roles import MetricsOptions, start_metrics
from node.net.dht import PulseDHT
from node.net.netconfig import NetOptions
from node.net.records import RecordRules
from node.run.manifest import load_manifest
from protocol.errors import ConfigError, NetworkError
from protocol.identity import Identity
from protocol.messages import HEAD_ROUND, PublicKeyHex, RunHead

WATCH_SECONDS = 5.0


class DhtOptions(MetricsOptions, NetOptions):
    """`pulse dht`'s options, the network's flags among them: --config or --run-id."""

    config: Path | None = None
    """the run manifest (gives the run id and its validators)"""
    run_id: PublicKeyHex | None = None
    """the run's id (64 hex, hash of its manifest)"""
    validators: list[PublicKeyHex] = Field(default_factory=list)
    """with --run-id: the validators' public keys"""

    @model_validator(mode="after")
    def _one_run(self) -> DhtOptions:
        if (self.config is None) == (self.run_id is None):
            raise ValueError("give one of --config or --run-id")
        if self.config is not None and self.validators:
            raise ValueError("--validators goes with --run-id; --config names the validators itself")
        return self


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("dht", help="run a bootstrap DHT peer and print its multiaddrs")
    add_options(parser, DhtOptions)
    parser.set_defaults(func=run_dht)


def rules_from(options: DhtOptions) -> RecordRules:
    """The record rules of the run `--config` (or `--run-id` and `--validators`) names."""
    if options.config is not None:
        manifest = load_manifest(options.config)
        return RecordRules(manifest.run_id, tuple(manifest.validators))
    return RecordRules(str(options.run_id), tuple(options.validators))


def read_head(dht: PulseDHT) -> None:
    """Read the run's head: a bootstrap reads nothing else, and the read tells its storage which rounds
    lie beyond the head (`PulseDHT.learn_head`). A read that fails is tried again at the next watch."""
    try:
        dht.get(RunHead, HEAD_ROUND)
    except NetworkError as exc:
        print(f"pulse dht: reading the run's head: {exc}", file=sys.stderr, flush=True)


def run_dht(args: argparse.Namespace) -> int:
    try:
        options = options_from(DhtOptions, args)
        config = options.net_config()
        rules = rules_from(options)
        # The bootstrap signs nothing; it only stores and serves records, so any key will do.
        identity = Identity.generate()
        dht = PulseDHT.start(config, rules, identity)
    except (ConfigError, NetworkError) as exc:
        print(f"pulse dht: {exc}", file=sys.stderr)
        return 2
    try:
        metrics = start_metrics(options, "dht", "bootstrap", rules.run_id, identity.public_hex)
    except OSError as exc:
        print(f"pulse dht: --metrics-port {options.metrics_port}: {exc}", file=sys.stderr)
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
            if rules.validators:
                read_head(dht)
    except NetworkError as exc:
        print(f"pulse dht: {exc}", file=sys.stderr)
        return 1
    finally:
        if metrics is not None:
            metrics.close()
        dht.shutdown()
    return 0
