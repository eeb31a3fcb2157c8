"""`pulse export`: the run's model as a Hugging Face folder with its contributor ledger, and `--verify`.

pulse export --state-dir D --config C --out DIR              # a validator's state folder
pulse export --checkpoint latest|ROUND --config C --initial-peers ... --out DIR   # from the run
pulse export --checkpoint FILE --state-hash H --config C --out DIR       # a checkpoint blob on disk
pulse export --verify DIR                                     # signatures, hash chain, weights
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from node.commands.roles import DEFAULT_CONFIG
from node.net.netconfig import NetConfig, add_net_arguments, net_config_from_args
from node.net.p2ppeer import P2PPeer
from node.roles.export import Source, from_checkpoint, from_run, from_state_dir, summary, verify_export, write_export
from node.roles.records import run_records
from node.run.manifest import Manifest, load_manifest
from protocol.errors import ConfigError, CorruptState, NetworkError, ProtocolError
from protocol.identity import Identity


def register(subparsers: Any) -> None:
    text = "write the run's current model as a Hugging Face folder, with the signed ledger of who trained it"
    parser = subparsers.add_parser("export", help=text, description=text)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--state-dir", type=Path, help="a validator's state folder (its --state-dir)")
    source.add_argument(
        "--checkpoint",
        help="`latest` or a round: the run's checkpoint of that round, fetched (with --initial-peers); "
        "or a checkpoint blob on disk (with --state-hash)",
    )
    source.add_argument("--verify", type=Path, metavar="DIR", help="check an exported folder instead")
    parser.add_argument("--state-hash", help="with --checkpoint: the state hash it must have (64 hex)")
    parser.add_argument("--round", type=int, help="with --checkpoint: the round whose state it is")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="run manifest TOML (%(default)s)")
    parser.add_argument("--out", type=Path, help="the folder to write (new or empty)")
    parser.add_argument("--json", action="store_true", help="with --verify: print one JSON object")
    add_net_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.verify is not None:
            return _verify(args.verify, args.json)
        if args.out is None:
            raise ConfigError("--out: the folder to write is required")
        manifest = load_manifest(args.config)
        if args.checkpoint is not None and (args.checkpoint == "latest" or args.checkpoint.isdigit()):
            wanted = None if args.checkpoint == "latest" else int(args.checkpoint)
            source = asyncio.run(_from_run(manifest, net_config_from_args(args), wanted))
        elif args.checkpoint is not None:
            if not args.state_hash:
                raise ConfigError("--checkpoint FILE needs --state-hash (or give `latest` or a round)")
            source = from_checkpoint(Path(args.checkpoint), args.state_hash, args.round)
        else:
            source = from_state_dir(args.state_dir)
        results = write_export(source, manifest, args.out)
    except (ConfigError, CorruptState, ProtocolError, NetworkError) as exc:
        print(f"pulse export: {exc}", file=sys.stderr)
        return 2
    rounds = f"{len(results)} signed round results" if results else "no ledger"
    which = f"round {source.round}" if source.round is not None else "a checkpoint of unknown round"
    print(f"exported {which} (state {source.state_hash[:12]}..., {rounds}) to {args.out}")
    return 0


async def _from_run(manifest: Manifest, config: NetConfig, round_: int | None) -> Source:
    """The run's checkpoint of `round_` (None: the newest), fetched by a throwaway reader."""
    with tempfile.TemporaryDirectory(prefix="pulse-export-") as folder:
        peer = await P2PPeer.create(config, run_records(manifest), Identity.generate(), Path(folder), role="follower")
        try:
            return await from_run(peer, round_)
        finally:
            await peer.shutdown()


def _verify(folder: Path, as_json: bool) -> int:
    try:
        checked = verify_export(folder)
    except (ConfigError, CorruptState, ProtocolError) as exc:
        print(f"pulse export --verify: FAILED: {exc}", file=sys.stderr)
        return 1
    facts = summary(checked)
    if as_json:
        print(json.dumps(facts, indent=2))
    else:
        print(
            f"verified: {facts['rounds_verified']} signed round results of run {checked.run_id[:16]}..., one hash "
            f"chain ending at the weights ({checked.state_hash[:12]}...); {facts['contributors']} miners aggregated; "
            f"{checked.initial}"
        )
    return 0
