"""`pulse bench NAME`: benchmarks that print a table, or one JSON object with `--json`.

Each benchmark module exposes `Options`, its options model (`options.py`: the flags and their help
are generated from it), and `run(options) -> BenchResult`: the built-ins of `BENCHES`, then those
other installed packages register in the entry-point group `pulse.bench` (pulse's red team,
`tests/redteam/`, adds `attacks` and `failover` there).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from node.bench.report import BenchResult
from node.commands.options import add_options, parsed

BENCHES = {
    "trace": "node.bench.trace",
    "sync": "node.bench.sync",
    "transfer": "node.bench.transfer",
    "loco": "node.bench.loco",
    "gauntlet": "node.bench.gauntlet",
    "scale": "node.bench.scale",
    "memory": "node.bench.memory",
    "rl": "node.bench.rl",
    "links": "node.bench.links",
    "gpu": "node.bench.gpu",
}
GROUP = "pulse.bench"
"""The entry-point group of benchmarks from other packages: each entry's value is a module, as above."""


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="measure pulse: codecs, transfer, training, validator")
    names = bench.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, module in benches().items():
        if isinstance(module, str):  # an installed benchmark that does not import: say so when asked for
            sub = names.add_parser(name, help=f"(cannot load: {module})")
            sub.set_defaults(func=lambda args, why=module, n=name: _unloadable(n, why))
            continue
        sub = names.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
        add_options(sub, module.Options)
        sub.set_defaults(func=lambda args, m=module, n=name: _run(m, n, args))


def benches() -> dict[str, ModuleType | str]:
    """The built-ins, then the installed `pulse.bench` entry points (a built-in's name is kept for it);
    an entry point that fails to load maps to why, so one broken package never hides the others."""
    found: dict[str, ModuleType | str] = {name: importlib.import_module(path) for name, path in BENCHES.items()}
    for entry in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        if entry.name in found:
            continue
        try:
            loaded = entry.load()
        except Exception as exc:  # a broken plugin: its name stays listed with the reason
            found[entry.name] = f"{entry.value}: {type(exc).__name__}: {exc}"
            continue
        found[entry.name] = loaded if isinstance(loaded, ModuleType) else f"{entry.value} is not a module"
    return found


def _unloadable(name: str, why: str) -> int:
    print(f"pulse bench {name}: cannot load the benchmark ({why})", file=sys.stderr)
    return 2


def _run(module: Any, name: str, args: argparse.Namespace) -> int:
    options = parsed(module.Options, args, f"bench {name}")
    if options is None:
        return 2
    result: BenchResult = module.run(options)
    if args.json:
        print(json.dumps(result.summary, sort_keys=True))
    else:
        result.print_tables()
    return 0
