"""`pulse export`: the run's model as a Hugging Face folder with its contributor ledger, and `--verify`.

pulse export --state-dir D --config C --out DIR              # a validator's state folder
pulse export --checkpoint FILE --state-hash H --config C --out DIR
pulse export --verify DIR                                     # signatures, hash chain, weights
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from node.commands.roles import DEFAULT_CONFIG
from node.roles.export import from_checkpoint, from_state_dir, summary, verify_export, write_export
from node.run.manifest import load_manifest
from protocol.errors import ConfigError, CorruptState, ProtocolError


def register(subparsers: Any) -> None:
    text = "write the run's current model as a Hugging Face folder, with the signed ledger of who trained it"
    parser = subparsers.add_parser("export", help=text, description=text)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--state-dir", type=Path, help="a validator's state folder (its --state-dir)")
    source.add_argument("--checkpoint", type=Path, help="a checkpoint blob fetched from the run (safetensors)")
    source.add_argument("--verify", type=Path, metavar="DIR", help="check an exported folder instead")
    parser.add_argument("--state-hash", help="with --checkpoint: the state hash it must have (64 hex)")
    parser.add_argument("--round", type=int, help="with --checkpoint: the round whose state it is")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="run manifest TOML (%(default)s)")
    parser.add_argument("--out", type=Path, help="the folder to write (new or empty)")
    parser.add_argument("--json", action="store_true", help="with --verify: print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.verify is not None:
            return _verify(args.verify, args.json)
        if args.out is None:
            raise ConfigError("--out: the folder to write is required")
        manifest = load_manifest(args.config)
        if args.checkpoint is not None:
            if not args.state_hash:
                raise ConfigError("--checkpoint needs --state-hash (from the checkpoint's announcement)")
            source = from_checkpoint(args.checkpoint, args.state_hash, args.round)
        else:
            source = from_state_dir(args.state_dir)
        results = write_export(source, manifest, args.out)
    except (ConfigError, CorruptState, ProtocolError) as exc:
        print(f"pulse export: {exc}", file=sys.stderr)
        return 2
    rounds = f"{len(results)} signed round results" if results else "no ledger"
    print(f"exported round {source.round} (state {source.state_hash[:12]}..., {rounds}) to {args.out}")
    return 0


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
