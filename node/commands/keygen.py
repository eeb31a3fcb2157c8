"""`pulse keygen`: create this node's Ed25519 identity key file and print its public key."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from node.net.keyfile import DEFAULT_KEY_PATH, write_key_file
from protocol.errors import KeyFileError
from protocol.identity import Identity


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("keygen", help="create an Ed25519 identity key file (mode 0600)")
    parser.add_argument("--out", type=Path, default=DEFAULT_KEY_PATH, help="key file to write (%(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    identity = Identity.generate()
    try:
        write_key_file(identity, args.out)
    except KeyFileError as exc:
        print(f"pulse keygen: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    print(f"public key: {identity.public_hex}")
    return 0
