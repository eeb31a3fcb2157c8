"""`pulse run-id`: print a manifest's run id (the SHA-256 of the whole file), e.g. for `pulse dht --run-id`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from node.commands.options import OPTIONS, add_options, options_from
from node.run.manifest import load_manifest
from protocol.errors import ConfigError


class RunIdOptions(BaseModel):
    """`pulse run-id`'s options."""

    model_config = OPTIONS

    config: Path
    """the run manifest TOML"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("run-id", help="print the run id of a manifest (the hash of the whole file)")
    add_options(parser, RunIdOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        print(load_manifest(options_from(RunIdOptions, args).config).run_id)
    except ConfigError as exc:
        print(f"pulse run-id: {exc}", file=sys.stderr)
        return 2
    return 0
