"""`pulse`: the one entry point. It parses flags and calls library functions, nothing more.

Each command lives in its own module that exposes `register(subparsers)`; the parser it adds
sets `func(args) -> int`. Commands are listed in `COMMANDS` in the order `--help` shows them, and
only the module of the command being run is imported.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "keygen": ("node.commands.keygen", "create an Ed25519 identity key file (mode 0600)"),
    "run-id": ("node.commands.runid", "print the run id of a manifest (the hash of the whole file)"),
    "dht": ("node.commands.dht", "run a bootstrap DHT peer and print its multiaddrs"),
    "validator": ("node.commands.roles", "run the validator: collect, score, aggregate and publish each round"),
    "miner": ("node.commands.roles", "train on assigned data each round and submit compressed pseudo-gradients"),
    "follow": (
        "node.commands.roles",
        "keep bit-identical BF16 weights through PULSESync patches (an inference worker)",
    ),
    "audit": (
        "node.commands.roles",
        "recompute every round from the published payloads on an FP32 replica; report any mismatch",
    ),
    "demo": ("node.commands.demo", "run a whole swarm on loopback and report on it"),
    "status": ("node.commands.status", "show the run's current round, active nodes and latest scores"),
    "receipt": (
        "node.commands.receipt",
        "why a miner's submission of a round was selected or not, with its gains recomputed locally",
    ),
    "doctor": (
        "node.commands.doctor",
        "measure this machine and its links to the run, and forecast whether it keeps up",
    ),
    "export": (
        "node.commands.export",
        "write the run's current model as a Hugging Face folder, with the signed ledger of who trained it",
    ),
    "dashboard": (
        "node.commands.dashboard",
        "serve a live web page for the run: rounds, loss, leaderboard, bytes, nodes online",
    ),
    "bench": ("node.commands.bench", "measure pulse: codecs, transfer, training, validator"),
}
"""name -> (the module that registers it, its one-line help), in the order `--help` shows them.

Only the module of the command being run is imported (the roles, torch and hivemind take seconds
to import): the others get a parser with their help line, so `pulse --help` stays fast. Each module's
`register` adds its own parsers with the same help (a test holds them equal)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (none without one: `pulse --help`)."""
    parser = argparse.ArgumentParser(
        prog="pulse",
        description="Permissionless peer-to-peer training: miners, validators and followers on a libp2p DHT.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = {module for name, (module, _) in COMMANDS.items() if name == command}
    registered: set[str] = set()
    for name, (module, text) in COMMANDS.items():
        if module in wanted:
            if module not in registered:
                registered.add(module)
                importlib.import_module(module).register(subparsers)
        else:
            subparsers.add_parser(name, help=text)
    return parser


def chosen(argv: list[str]) -> str | None:
    """The command `argv` names (its first word that is one), if any."""
    return next((word for word in argv if word in COMMANDS), None)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(chosen(words)).parse_args(words)
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
