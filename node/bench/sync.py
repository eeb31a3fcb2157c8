"""sync: PULSESync patch size and speed on a real update trace, against the plain encoding.

For every pair (step t, step t + delay) of a trace made by `pulse bench trace`, both codecs
encode and decode the patch, interleaved so that they share the machine's conditions. Sizes are
summed over all pairs. The bound is the empirical entropy under PULSESync's own model: positions
at log2 C(n, k) per (tensor, old exponent) class, values at the order-0 entropy of each
(dtype, old exponent) value model plus their uniform extra bits; the order-0 bound uses one
Bernoulli per tensor for positions and one distribution for all bit-pattern differences.
Speeds are GB of BF16 weights per second in this one process; `apply_gbps` includes the two
SHA-256 state checks every real apply makes, which the codec speeds leave out.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.bench import plainpatch
from node.bench.report import BenchResult, table
from node.bench.trace import load_trace, make_trace, read_manifest
from node.events import steps
from node.learn.basecache import DEFAULT_STEPS, default_cache_dir, load_or_train
from node.learn.data import stdlib_corpus
from protocol import pulsesync
from protocol.state import State, StateDict
from protocol.statehash import state_hash


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lr", type=float, default=1e-6, help="learning rate of the trace")
    parser.add_argument("--delay", type=int, default=1, help="patch between step t and t+delay")
    parser.add_argument("--steps", type=int, default=40, help="trace length, made if missing")
    parser.add_argument("--trace", type=Path, default=None, help="trace folder (default: <cache dir>/trace-lr<LR>)")
    parser.add_argument("--repeat", type=int, default=3, help="timing repeats per pair; the fastest counts")
    parser.add_argument("--cache-dir", type=Path, default=None, help="base model cache ($PULSE_CACHE_DIR)")


def run(args: argparse.Namespace) -> BenchResult:
    if args.delay < 1 or args.repeat < 1:
        raise SystemExit("--delay and --repeat must be >= 1")
    states = _trace(args)
    if len(states) <= args.delay:
        raise SystemExit(f"the trace has {len(states)} states, too few for delay {args.delay}")
    hashes = [state_hash(s) for s in states]
    totals: dict[str, float] = dict.fromkeys(
        ["elements", "changed", "bytes", "base_bytes", "bound", "order0", "dense_tensors", "lossless"], 0.0
    )
    times: dict[str, float] = dict.fromkeys(["enc", "dec", "base_enc", "base_dec", "apply", "hash"], 0.0)
    pairs = len(states) - args.delay
    for t in steps(range(pairs), "patch pairs"):
        _measure_pair(states[t], states[t + args.delay], hashes[t], hashes[t + args.delay], args.repeat, totals, times)
    return _result(args, pairs, totals, times)


def _trace(args: argparse.Namespace) -> list[StateDict]:
    trace_dir = args.trace or (args.cache_dir or default_cache_dir()) / f"trace-lr{args.lr:g}"
    try:
        manifest = read_manifest(trace_dir)
        if manifest["lr"] == args.lr and manifest["steps"] >= args.steps:
            return load_trace(trace_dir)
    except (OSError, ValueError, KeyError):
        pass  # no usable trace there: make one
    if args.trace is not None and (trace_dir / "trace.json").exists():
        raise SystemExit(f"{trace_dir} holds a trace for another lr or fewer steps")
    corpus = stdlib_corpus()
    base = load_or_train(None, DEFAULT_STEPS, args.cache_dir, corpus=corpus)
    return make_trace(trace_dir, base, corpus, args.lr, args.steps).states


def _best(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _measure_pair(
    old: State, new: State, h_old: str, h_new: str, repeat: int, totals: dict[str, float], times: dict[str, float]
) -> None:
    patch, stats = pulsesync.encode_with_stats(old, new, old_hash=h_old, new_hash=h_new)
    dt, _ = _best(repeat, lambda: pulsesync.encode(old, new, old_hash=h_old, new_hash=h_new))
    times["enc"] += dt
    dt, base_patch = _best(repeat, lambda: plainpatch.encode(old, new))
    times["base_enc"] += dt
    dt, _ = _best(repeat, lambda: pulsesync.apply_unverified(old, patch))
    times["dec"] += dt
    dt, base_new = _best(repeat, lambda: plainpatch.apply(old, base_patch))
    times["base_dec"] += dt
    dt, applied = _best(1, lambda: pulsesync.apply(old, patch))  # raises unless both hashes match
    times["apply"] += dt
    dt, _ = _best(1, lambda: state_hash(old))
    times["hash"] += dt
    totals["lossless"] += state_hash(applied) == h_new and state_hash(base_new) == h_new
    totals["elements"] += stats.elements
    totals["changed"] += stats.changed
    totals["bytes"] += len(patch)
    totals["base_bytes"] += len(base_patch)
    totals["bound"] += stats.position_bound_bits + stats.value_bound_bits
    totals["order0"] += stats.order0_position_bits + stats.order0_value_bits
    totals["dense_tensors"] += stats.dense_tensors


def _result(args: argparse.Namespace, pairs: int, totals: dict[str, float], times: dict[str, float]) -> BenchResult:
    changed = max(totals["changed"], 1.0)
    dense_bytes = 2 * totals["elements"]  # the trace is BF16
    gb = dense_bytes / 1e9
    summary = {
        "lr": args.lr,
        "delay": args.delay,
        "pairs": pairs,
        "lossless": totals["lossless"] == pairs,
        "density": totals["changed"] / totals["elements"],
        "bits_per_changed": 8 * totals["bytes"] / changed,
        "baseline_bits_per_changed": 8 * totals["base_bytes"] / changed,
        "bound_bits_per_changed": totals["bound"] / changed,
        "order0_bound_bits_per_changed": totals["order0"] / changed,
        "ratio_vs_dense": dense_bytes / totals["bytes"],
        "baseline_ratio_vs_dense": dense_bytes / totals["base_bytes"],
        "mean_patch_bytes": totals["bytes"] / pairs,
        "dense_tensors": int(totals["dense_tensors"]),
        "encode_gbps": gb / times["enc"],
        "decode_gbps": gb / times["dec"],
        "baseline_encode_gbps": gb / times["base_enc"],
        "baseline_decode_gbps": gb / times["base_dec"],
        "apply_gbps": gb / times["apply"],
        "sha256_gbps": gb / times["hash"],
    }
    summary["x_bound"] = summary["bits_per_changed"] / summary["bound_bits_per_changed"]
    summary["x_smaller_than_baseline"] = summary["baseline_bits_per_changed"] / summary["bits_per_changed"]
    return BenchResult(summary, _tables(summary))


def _ratio(s: dict[str, Any], bits_key: str) -> float:
    """Compression vs dense BF16 that a size of `bits_key` bits per changed weight would give."""
    return float(16 / (s[bits_key] * s["density"]))


def _tables(s: dict[str, Any]) -> list[Any]:
    sizes = table(
        f"PULSESync patch size, lr {s['lr']:g}, delay {s['delay']}, {s['pairs']} patches, "
        f"{100 * s['density']:.2f}% of weights changed, lossless: {'yes' if s['lossless'] else 'NO'}",
        ["encoding", "bits per changed weight", "x vs dense BF16"],
        [
            ["PULSESync", s["bits_per_changed"], s["ratio_vs_dense"]],
            [
                "plain: int32 delta indices + values + zstd-1",
                s["baseline_bits_per_changed"],
                s["baseline_ratio_vs_dense"],
            ],
            ["bound under PULSESync's model", s["bound_bits_per_changed"], _ratio(s, "bound_bits_per_changed")],
            ["order-0 bound", s["order0_bound_bits_per_changed"], _ratio(s, "order0_bound_bits_per_changed")],
        ],
    )
    speed = table(
        "Speed (GB of BF16 weights per second, one process)",
        ["codec", "encode", "decode"],
        [
            ["PULSESync", s["encode_gbps"], s["decode_gbps"]],
            ["plain", s["baseline_encode_gbps"], s["baseline_decode_gbps"]],
            ["PULSESync apply with both SHA-256 checks", "", s["apply_gbps"]],
        ],
    )
    targets = table(
        "Targets",
        ["target", "measured", "met"],
        [
            ["size <= 1.10 x bound", f"{s['x_bound']:.3f} x", s["x_bound"] <= 1.10],
            [">= 3x smaller than plain", f"{s['x_smaller_than_baseline']:.2f} x", s["x_smaller_than_baseline"] >= 3],
            [
                "encode >= plain",
                f"{s['encode_gbps']:.3f} vs {s['baseline_encode_gbps']:.3f}",
                s["encode_gbps"] >= s["baseline_encode_gbps"],
            ],
            [
                "decode >= plain",
                f"{s['decode_gbps']:.3f} vs {s['baseline_decode_gbps']:.3f}",
                s["decode_gbps"] >= s["baseline_decode_gbps"],
            ],
        ],
    )
    return [sizes, speed, targets]
