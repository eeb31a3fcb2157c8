"""`pulse`: the one entry point. It parses flags and calls library functions, nothing more.

Each command lives in its own module that exposes `register(subparsers)`; the parser it adds
sets `func(args) -> int`. Commands are listed in `COMMANDS` in the order `--help` shows them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMANDS = [
    "node.commands.keygen",
    "node.commands.dht",
    "node.commands.roles",
    "node.commands.demo",
    "node.commands.status",
    "node.commands.receipt",
    "node.commands.export",
    "node.commands.dashboard",
    "node.commands.bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pulse",
        description="Permissionless peer-to-peer training: miners, validators and followers on a libp2p DHT.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
