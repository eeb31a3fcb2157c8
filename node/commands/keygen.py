"""`pulse keygen`: create this node's Ed25519 identity key file and print its public key."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from node.commands.options import OPTIONS, add_options, parsed
from node.net.keyfile import DEFAULT_KEY_PATH, write_key_file
from protocol.errors import KeyFileError
from protocol.identity import Identity


class KeygenOptions(BaseModel):
    """`pulse keygen`'s options."""

    model_config = OPTIONS

    out: Path = DEFAULT_KEY_PATH
    """key file to write"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("keygen", help="create an Ed25519 identity key file (mode 0600)")
    add_options(parser, KeygenOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (options := parsed(KeygenOptions, args, "keygen")) is None:
        return 2
    return keygen(options)


def keygen(options: KeygenOptions) -> int:
    """Write a fresh key to `options.out` (never over an existing file) and print its public key."""
    identity = Identity.generate()
    try:
        write_key_file(identity, options.out)
    except KeyFileError as exc:
        print(f"pulse keygen: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {options.out}")
    print(f"public key: {identity.public_hex}")
    return 0
