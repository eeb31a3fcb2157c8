"""`pulse bench NAME`: benchmarks that print a table, or one JSON object with `--json`.

Each benchmark module in `BENCHES` exposes `configure(parser)` (its flags) and
`run(args) -> BenchResult`.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

from node.bench.report import BenchResult

BENCHES = {
    "trace": "node.bench.trace",
    "sync": "node.bench.sync",
    "transfer": "node.bench.transfer",
    "loco": "node.bench.loco",
    "gauntlet": "node.bench.gauntlet",
    "scale": "node.bench.scale",
    "memory": "node.bench.memory",
    "rl": "node.bench.rl",
    "attacks": "node.bench.attacks",
    "failover": "node.bench.failover",
    "links": "node.bench.links",
    "gpu": "node.bench.gpu",
}


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="measure pulse: codecs, transfer, training, validator")
    names = bench.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, module_path in BENCHES.items():
        module = importlib.import_module(module_path)
        sub = names.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
        module.configure(sub)
        sub.set_defaults(func=lambda args, m=module: _run(m, args))


def _run(module: Any, args: argparse.Namespace) -> int:
    result: BenchResult = module.run(args)
    if args.json:
        print(json.dumps(result.summary, sort_keys=True))
    else:
        result.print_tables()
    return 0
