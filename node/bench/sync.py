"""sync: PULSESync patch size, speed and memory on a real update trace, against the plain encoding.

Two traces. `--model tiny` (the default): the embedded GPT (3.2M parameters), from the cached base,
40 AdamW steps (`pulse bench trace`). `--model qwen2-0.5b`: a model of Qwen2.5-0.5B's
architecture (about 494M parameters, 1 GB in BF16; seeded weights, nothing downloaded), 3 AdamW
steps on byte ids of the embedded corpus; both at lr 1e-6 with FP32 master weights, made once and
cached on disk (`node/bench/trace.py`). States are streamed pair by pair, never all in memory.

For every pair (step t, step t + delay), on `--device` (cpu, or cuda: the states live there and
the codecs take them from there), measured side by side so that they share the machine's
conditions, each the fastest of `--repeat` runs:

- PULSESync encode and decode (the codec alone), and the plain encoding's (plainpatch.py);
- apply: decode with both state-hash checks as a node makes it (it knows the hash of the state it
  holds, so only the new state is hashed, slab by slab while it is decoded);
- memcpy: one copy of each state (old and new) into a scratch buffer, i.e. reading both states
  once: the physical limit of any codec that reads them;
- sha256: hashing one state from scratch (protocol/statehash.py, all cores);
- peak extra memory of encode and of apply beyond the states themselves (peakmem.py), one
  untimed run each.

Sizes are summed over all pairs. The bound is the empirical entropy under PULSESync's own model:
positions at log2 C(n, k) per (tensor, old exponent) class, values at the order-0 entropy of each
(dtype, old exponent) value model plus their uniform extra bits; the order-0 bound uses one
Bernoulli per tensor for positions and one distribution for all bit-pattern differences. Speeds
are GB of BF16 weights (one state) per second.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field

from node.bench import plainpatch
from node.bench.peakmem import PeakMemory
from node.bench.report import BenchResult, table
from node.bench.trace import hf_trace_dir, make_hf_trace, make_trace, read_manifest, trace_pairs
from node.events import steps as with_progress
from node.learn.basecache import DEFAULT_STEPS, default_cache_dir, load_or_train
from node.learn.data import stdlib_corpus
from protocol import pulsesync
from protocol.parsing import STRICT
from protocol.state import State, StateDict
from protocol.statehash import state_hash
from protocol.tensorbytes import bits

DEFAULT_TRACE_STEPS = {"tiny": 40, "qwen2-0.5b": 3}
MEMORY_TARGET = 0.25  # extra peak memory of encode and of apply, as a share of one BF16 state
_PHASES = ("enc", "dec", "base_enc", "base_dec", "apply", "hash", "memcpy")


class Options(BaseModel):
    """`pulse bench sync`'s options."""

    model_config = STRICT

    model: Literal["tiny", "qwen2-0.5b"] = "tiny"
    """whose update trace: tiny (3.2M) or 0.5B"""
    lr: float = Field(default=1e-6, gt=0, allow_inf_nan=False)
    """learning rate of the trace"""
    delay: int = Field(default=1, ge=1)
    """patch between step t and t+delay"""
    steps: int | None = Field(default=None, ge=1)
    """trace length, made if missing (tiny 40, 0.5B 3)"""
    trace: Path | None = None
    """trace folder (default: in the cache dir)"""
    repeat: int = Field(default=3, ge=1)
    """timing repeats per pair; the fastest counts"""
    device: str = "cpu"
    """where the states live: cpu or cuda"""
    cache_dir: Path | None = None
    """base model and trace cache ($PULSE_CACHE_DIR)"""
    threads: int = Field(default=1, ge=1)
    """torch CPU threads (the codecs use their own pool)"""


def run(options: Options) -> BenchResult:
    device = torch.device(options.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    torch.set_num_threads(options.threads)
    steps = options.steps if options.steps is not None else DEFAULT_TRACE_STEPS[options.model]
    trace_dir = _trace(options, steps)
    if len(read_manifest(trace_dir)["files"]) <= options.delay:
        raise SystemExit(f"the trace in {trace_dir} is too short for delay {options.delay}")
    warm_up(device)
    totals, times, peaks = new_tallies()
    pairs = 0
    n_pairs = len(read_manifest(trace_dir)["files"]) - options.delay
    for old, new in with_progress(_pairs(trace_dir, options.delay, device), "patch pairs", total=n_pairs):
        measure_pair(old, new, options.repeat, totals, times, peaks)
        pairs += 1
    state_bytes = 2 * totals["elements"] / pairs
    return _result(options, steps, pairs, state_bytes, totals, times, peaks, device)


def new_tallies() -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """Empty (totals, times, peaks) for `measure_pair` to add pairs into."""
    totals = dict.fromkeys(["elements", "changed", "bytes", "base_bytes", "bound", "order0", "dense_tensors"], 0.0)
    totals["lossless"] = totals["coder_seconds"] = 0.0
    return totals, dict.fromkeys(_PHASES, 0.0), {"encode": 0, "apply": 0, "device": 0}


def _trace(options: Options, steps: int) -> Path:
    """The trace folder, made (and cached) if it is missing, shorter or for another lr."""
    cache = options.cache_dir or default_cache_dir()
    if options.trace is not None:
        trace_dir = options.trace
    elif options.model == "tiny":
        trace_dir = cache / f"trace-lr{options.lr:g}"
    else:
        trace_dir = hf_trace_dir(cache, options.model, options.lr)
    try:
        manifest = read_manifest(trace_dir)
        if manifest["lr"] == options.lr and manifest["steps"] >= steps:
            return trace_dir
    except (OSError, ValueError, KeyError):
        pass  # no usable trace there: make one
    if options.trace is not None and (trace_dir / "trace.json").exists():
        raise SystemExit(f"{trace_dir} holds a trace for another lr or fewer steps")
    if options.model == "tiny":
        corpus = stdlib_corpus()
        base = load_or_train(None, DEFAULT_STEPS, options.cache_dir, corpus=corpus)
        make_trace(trace_dir, base, corpus, options.lr, steps)
    else:
        make_hf_trace(trace_dir, options.model, options.lr, steps, device=options.device)
    return trace_dir


def _pairs(trace_dir: Path, delay: int, device: torch.device) -> Iterator[tuple[StateDict, StateDict]]:
    for old, new in trace_pairs(trace_dir, delay):
        yield {n: t.to(device) for n, t in old.items()}, {n: t.to(device) for n, t in new.items()}


def warm_up(device: torch.device) -> None:
    """Compile the codec's kernels (numba, cached on disk) before anything is timed or measured."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16,):
        w = torch.randn(4096, generator=gen) * 0.02
        old = {"a": w.to(dtype).to(device), "b": torch.zeros(64, dtype=dtype, device=device)}
        new = {"a": (w - 1e-4 * torch.randn(4096, generator=gen)).to(dtype).to(device), "b": old["b"] + 1e-3}
        pulsesync.apply(old, pulsesync.encode(old, new))


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _memcpy(old: State, new: State) -> None:
    """Read both states once: copy every tensor into one scratch buffer (numpy's copy on the CPU)."""
    some = next(iter(old.values()))
    largest = max(t.numel() for t in old.values())
    scratch = torch.empty(largest, dtype=some.dtype, device=some.device)
    host = bits(scratch) if some.device.type == "cpu" else None
    for state in (old, new):
        for t in state.values():
            if host is not None:
                np.copyto(host[: t.numel()], bits(t))
            else:
                scratch[: t.numel()].copy_(t.reshape(-1))


def measure_pair(
    old: State,
    new: State,
    repeat: int,
    totals: dict[str, float],
    times: dict[str, float],
    peaks: dict[str, int],
) -> None:
    device = next(iter(old.values())).device
    h_old, h_new = state_hash(old), state_hash(new)
    patch, stats = pulsesync.encode_with_stats(old, new, old_hash=h_old, new_hash=h_new)
    with PeakMemory(device) as mem:
        pulsesync.encode(old, new, old_hash=h_old, new_hash=h_new)
    peaks["encode"] = max(peaks["encode"], mem.extra_bytes or 0)
    peaks["device"] = max(peaks["device"], mem.device_extra_bytes or 0)
    with PeakMemory(device) as mem:
        applied = pulsesync.apply(old, patch, held_hash=h_old)  # raises unless both hashes match
    state_bytes = sum(t.numel() * t.element_size() for t in old.values())
    on_host = state_bytes if device.type == "cpu" else 0  # the new state itself is not extra
    peaks["apply"] = max(peaks["apply"], (mem.extra_bytes or 0) - on_host)
    peaks["device"] = max(peaks["device"], (mem.device_extra_bytes or state_bytes) - state_bytes)
    del applied
    best: dict[str, float] = {}

    def timed(phase: str, fn: Callable[[], Any]) -> Any:
        dt, out = _timed(fn, device)
        best[phase] = min(best.get(phase, float("inf")), dt)
        return out

    for _ in range(repeat):  # interleaved, so that every phase sees the same machine
        timed("enc", lambda: pulsesync.encode(old, new, old_hash=h_old, new_hash=h_new))
        base_patch = timed("base_enc", lambda: plainpatch.encode(old, new))
        timed("dec", lambda: pulsesync.apply_unverified(old, patch))
        base_new = timed("base_dec", functools.partial(plainpatch.apply, old, base_patch))
        applied = timed("apply", lambda: pulsesync.apply(old, patch, held_hash=h_old))
        timed("hash", lambda: state_hash(old))
        timed("memcpy", lambda: _memcpy(old, new))
    for phase, dt in best.items():
        times[phase] += dt
    totals["lossless"] += state_hash(applied) == h_new and state_hash(base_new) == h_new
    totals["elements"] += stats.elements
    totals["changed"] += stats.changed
    totals["bytes"] += len(patch)
    totals["base_bytes"] += len(base_patch)
    totals["bound"] += stats.position_bound_bits + stats.value_bound_bits
    totals["order0"] += stats.order0_position_bits + stats.order0_value_bits
    totals["dense_tensors"] += stats.dense_tensors
    totals["coder_seconds"] += stats.coder_seconds


def _result(
    options: Options,
    steps: int,
    pairs: int,
    state_bytes: float,
    totals: dict[str, float],
    times: dict[str, float],
    peaks: dict[str, int],
    device: torch.device,
) -> BenchResult:
    changed = max(totals["changed"], 1.0)
    dense_bytes = 2 * totals["elements"]  # the trace is BF16
    gb = dense_bytes / 1e9
    summary: dict[str, Any] = {
        "model": options.model,
        "device": str(device),
        "params": int(totals["elements"] / pairs),
        "lr": options.lr,
        "delay": options.delay,
        "steps": steps,
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
        "coder_seconds_per_million_changed": 1e6 * totals["coder_seconds"] / changed,
        "sha256_gbps": gb / times["hash"],
        "memcpy_gbps": gb / times["memcpy"],
        "state_mb": state_bytes / 1e6,
        "encode_peak_extra_mb": peaks["encode"] / 1e6,
        "apply_peak_extra_mb": peaks["apply"] / 1e6,
        "peak_extra_mb": max(peaks["encode"], peaks["apply"]) / 1e6,
    }
    if device.type == "cuda":
        summary["device_peak_extra_mb"] = peaks["device"] / 1e6
    summary["x_bound"] = summary["bits_per_changed"] / summary["bound_bits_per_changed"]
    summary["x_smaller_than_baseline"] = summary["baseline_bits_per_changed"] / summary["bits_per_changed"]
    summary["targets"] = _targets(summary)
    return BenchResult(summary, _tables(summary))


def _targets(s: dict[str, Any]) -> dict[str, bool]:
    return {
        "encode_quarter_memcpy": s["encode_gbps"] >= 0.25 * s["memcpy_gbps"],
        "decode_quarter_memcpy": s["decode_gbps"] >= 0.25 * s["memcpy_gbps"],
        "size_within_1_10_of_bound": s["x_bound"] <= 1.10,
        "3x_smaller_than_plain": s["x_smaller_than_baseline"] >= 3,
        "encode_at_least_plain": s["encode_gbps"] >= s["baseline_encode_gbps"],
        "decode_at_least_plain": s["decode_gbps"] >= s["baseline_decode_gbps"],
        "apply_at_least_half_plain_decode": s["apply_gbps"] >= 0.5 * s["baseline_decode_gbps"],
        "extra_memory_within_25pct_of_state": s["peak_extra_mb"] <= MEMORY_TARGET * s["state_mb"],
        "lossless": bool(s["lossless"]),
    }


def _ratio(s: dict[str, Any], bits_key: str) -> float:
    """Compression vs dense BF16 that a size of `bits_key` bits per changed weight would give."""
    return float(16 / (s[bits_key] * s["density"]))


def _tables(s: dict[str, Any]) -> list[Any]:
    sizes = table(
        f"PULSESync patch size, {s['model']} ({s['params'] / 1e6:.1f}M parameters), lr {s['lr']:g}, "
        f"delay {s['delay']}, {s['pairs']} patches, {100 * s['density']:.2f}% of weights changed, "
        f"lossless: {'yes' if s['lossless'] else 'NO'}",
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
        f"Speed on {s['device']} (GB of BF16 weights per second, one process, all cores), state {s['state_mb']:.0f} MB",
        ["codec", "encode", "decode", "x memcpy (enc / dec)"],
        [
            ["PULSESync", s["encode_gbps"], s["decode_gbps"], _of_memcpy(s, "encode_gbps", "decode_gbps")],
            [
                "plain",
                s["baseline_encode_gbps"],
                s["baseline_decode_gbps"],
                _of_memcpy(s, "baseline_encode_gbps", "baseline_decode_gbps"),
            ],
            ["PULSESync apply, both state-hash checks", "", s["apply_gbps"], _of_memcpy(s, None, "apply_gbps")],
            ["memcpy: read both states once (the limit)", s["memcpy_gbps"], s["memcpy_gbps"], "1.00 / 1.00"],
            ["state hash of one state from scratch", "", s["sha256_gbps"], ""],
            ["host coder, seconds per million changed weights", s["coder_seconds_per_million_changed"], "", ""],
        ],
    )
    memory = table(
        "Peak memory beyond the states (MB)",
        ["phase", "extra", "share of one BF16 state"],
        [
            ["encode", s["encode_peak_extra_mb"], f"{s['encode_peak_extra_mb'] / s['state_mb']:.1%}"],
            ["apply", s["apply_peak_extra_mb"], f"{s['apply_peak_extra_mb'] / s['state_mb']:.1%}"],
        ],
    )
    t = s["targets"]
    targets = table(
        "Targets",
        ["target", "measured", "met"],
        [
            ["size <= 1.10 x bound", f"{s['x_bound']:.3f} x", t["size_within_1_10_of_bound"]],
            [">= 3x smaller than plain", f"{s['x_smaller_than_baseline']:.2f} x", t["3x_smaller_than_plain"]],
            [
                "encode >= plain",
                f"{s['encode_gbps']:.3f} vs {s['baseline_encode_gbps']:.3f}",
                t["encode_at_least_plain"],
            ],
            [
                "decode >= plain",
                f"{s['decode_gbps']:.3f} vs {s['baseline_decode_gbps']:.3f}",
                t["decode_at_least_plain"],
            ],
            [
                "apply >= half plain decode",
                f"{s['apply_gbps']:.3f} vs {0.5 * s['baseline_decode_gbps']:.3f}",
                t["apply_at_least_half_plain_decode"],
            ],
            [
                "extra memory <= 25% of a state",
                f"{s['peak_extra_mb']:.0f} MB of {s['state_mb']:.0f}",
                t["extra_memory_within_25pct_of_state"],
            ],
        ],
    )
    return [sizes, speed, memory, targets]


def _of_memcpy(s: dict[str, Any], enc: str | None, dec: str) -> str:
    left = f"{s[enc] / s['memcpy_gbps']:.2f}" if enc else "-"
    return f"{left} / {s[dec] / s['memcpy_gbps']:.2f}"
