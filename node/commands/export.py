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

from pydantic import Field, model_validator

from node.commands.options import add_options, options_from
from node.commands.roles import DEFAULT_CONFIG
from node.net.netconfig import NetConfig, NetOptions
from node.net.p2ppeer import P2PPeer
from node.roles.export import Source, from_checkpoint, from_run, from_state_dir, summary, verify_export, write_export
from node.roles.records import run_records
from node.run.manifest import Manifest, load_manifest
from protocol.errors import ConfigError, CorruptState, NetworkError, ProtocolError
from protocol.identity import Identity


class ExportOptions(NetOptions):
    """`pulse export`'s options, the network's flags among them: one source of three."""

    state_dir: Path | None = None
    """a validator's state folder (its --state-dir)"""
    checkpoint: str | None = None
    """`latest` or a round: the run's checkpoint of that round, fetched (with --initial-peers); or a checkpoint
    blob on disk (with --state-hash)"""
    verify: Path | None = None
    """check an exported folder instead"""
    state_hash: str | None = None
    """with --checkpoint: the state hash it must have (64 hex)"""
    round: int | None = None
    """with --checkpoint: the round whose state it is"""
    config: Path = DEFAULT_CONFIG
    """run manifest TOML"""
    out: Path | None = None
    """the folder to write (new or empty)"""
    print_json: bool = Field(default=False, alias="json")
    """with --verify: print one JSON object"""

    @property
    def from_run(self) -> bool:
        """`--checkpoint latest` or `--checkpoint ROUND`: fetched from the run, not read from a file."""
        return self.checkpoint is not None and (self.checkpoint == "latest" or self.checkpoint.isdigit())

    @model_validator(mode="after")
    def _one_source(self) -> ExportOptions:
        sources = [self.state_dir, self.checkpoint, self.verify]
        if sum(source is not None for source in sources) != 1:
            raise ValueError("give one of --state-dir, --checkpoint or --verify")
        if self.verify is None and self.out is None:
            raise ValueError("--out: the folder to write is required")
        if self.checkpoint is not None and not self.from_run and not self.state_hash:
            raise ValueError("--checkpoint FILE needs --state-hash (or give `latest` or a round)")
        return self


def register(subparsers: Any) -> None:
    text = "write the run's current model as a Hugging Face folder, with the signed ledger of who trained it"
    parser = subparsers.add_parser("export", help=text, description=text)
    add_options(parser, ExportOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from(ExportOptions, args)
        if options.verify is not None:
            return _verify(options.verify, options.print_json)
        if options.out is None:  # the model refuses this already; here for the type checker
            raise ConfigError("--out: the folder to write is required")
        manifest = load_manifest(options.config)
        source = _source(options, manifest)
        results = write_export(source, manifest, options.out)
    except (ConfigError, CorruptState, ProtocolError, NetworkError) as exc:
        print(f"pulse export: {exc}", file=sys.stderr)
        return 2
    rounds = f"{len(results)} signed round results" if results else "no ledger"
    which = f"round {source.round}" if source.round is not None else "a checkpoint of unknown round"
    print(f"exported {which} (state {source.state_hash[:12]}..., {rounds}) to {options.out}")
    return 0


def _source(options: ExportOptions, manifest: Manifest) -> Source:
    """The state to export: a state folder's, the run's (fetched on the network flags) or a blob's."""
    if options.state_dir is not None:
        return from_state_dir(options.state_dir)
    checkpoint = options.checkpoint or "latest"  # the model holds exactly one source
    if options.from_run:
        wanted = None if checkpoint == "latest" else int(checkpoint)
        return asyncio.run(_from_run(manifest, options.net_config(), wanted))
    return from_checkpoint(Path(checkpoint), options.state_hash or "", options.round)


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
