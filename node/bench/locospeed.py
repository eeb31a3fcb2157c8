"""loco --speed: how fast the pseudo-gradient codecs compress and decompress, and their peak memory.

The weights W are a model's BF16 state (by default a model of Qwen2.5-0.5B's architecture, about
494M parameters: the first state of the cached `pulse bench sync --model qwen2-0.5b` trace if it
is there, else built from its config with seeded weights). The pseudo-gradient Delta is seeded
Gaussian noise of std 1e-5 (about what 10 AdamW steps at lr 1e-6 move a weight) and the
error-feedback buffer starts at zero, so every codec sees the same input.

Each codec compresses (Delta, e, W) and decompresses its payload, the fastest of `--repeat` runs,
in GB of FP32 pseudo-gradient per second, with the peak resident memory of each phase above
where it started (peakmem.py; decompress returns a dense FP32 update, 4 bytes a weight, which is
counted). Beside them, `reference`: the plain encoding of SparseLoCo's own selection that the
widely used systems ship (top-k per 4096-element chunk with the same 64x64 tiles and the same
2-bit quantizer and error feedback, 12-bit packed indices, one byte per 2-bit value, 1-D tensors
as raw BF16), written here with torch ops. Target: SparseLoCo's compress + decompress no slower
than the reference's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from node.bench.peakmem import PeakMemory
from node.bench.report import BenchResult, table
from node.bench.trace import HF_MODELS, hf_trace_dir, read_manifest
from node.learn.basecache import default_cache_dir
from node.learn.hfmodel import build_hf_from_config
from node.learn.model import GPTConfig, build_gpt
from node.learn.train import bf16_state
from protocol.codec import Codec, make_codec
from protocol.sparseloco import CHUNK, TILE, in_chunk_order, is_dense, quantize

State = Mapping[str, torch.Tensor]
SPEED_CODECS = {"sparseloco": {}, "pulseloco": {"value_format": "bf16"}}
DELTA_STD = 1e-5


# -- the reference encoding -----------------------------------------------------------------


def _pack12(idx: torch.Tensor) -> torch.Tensor:
    """Chunk-local indices (< 4096) as 12 bits each: two indices in three bytes."""
    flat = idx.reshape(-1)
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    a, b = flat[0::2], flat[1::2]
    return torch.stack([a & 0xFF, (a >> 8) | ((b & 0xF) << 4), b >> 4], dim=1).reshape(-1).to(torch.uint8)


def _unpack12(packed: torch.Tensor, count: int) -> torch.Tensor:
    p = packed.reshape(-1, 3).to(torch.int64)
    a = p[:, 0] | ((p[:, 1] & 0xF) << 8)
    b = (p[:, 1] >> 4) | (p[:, 2] << 4)
    return torch.stack([a, b], dim=1).reshape(-1)[:count]


def reference_compress(
    delta: State, error: State, k: int = 64, beta: float = 0.95
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(payload parts per tensor, new error buffer): SparseLoCo's selection, packed plainly."""
    payload: dict[str, Any] = {}
    new_error: dict[str, torch.Tensor] = {}
    for name in sorted(delta):
        acc = error[name] * beta + delta[name]
        if is_dense(acc.shape):
            sent = acc.to(torch.bfloat16)
            payload[name] = sent.view(torch.int16)
            new_error[name] = acc - sent.float()
            continue
        co = in_chunk_order(acc)
        n_full = co.numel() // CHUNK
        full = co[: n_full * CHUNK].view(n_full, CHUNK)
        top = full.abs().topk(k, dim=1).indices  # (chunks, k), unsorted, as Templar ships them
        tail = co[n_full * CHUNK :]
        tail_top = tail.abs().topk(min(k, tail.numel())).indices
        values = torch.cat([full.gather(1, top).reshape(-1), tail[tail_top]])
        bins, centroids = quantize(values.cpu().numpy())
        sent = torch.from_numpy(centroids[bins]).to(co.device)
        e_co = co.clone()
        e_co[: n_full * CHUNK].view(n_full, CHUNK).scatter_(
            1, top, full.gather(1, top) - sent[: top.numel()].view_as(top)
        )
        e_co[n_full * CHUNK :][tail_top] = tail[tail_top] - sent[top.numel() :]
        index = torch.cat([top.reshape(-1), tail_top])
        payload[name] = (_pack12(index), torch.from_numpy(bins.astype(np.uint8)), torch.from_numpy(centroids))
        new_error[name] = _from_chunk_order(e_co, acc.shape)
    return payload, new_error


def reference_decompress(payload: dict[str, Any], weights: State, k: int = 64) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name in sorted(weights):
        shape, part = weights[name].shape, payload[name]
        if is_dense(shape):
            out[name] = part.view(torch.bfloat16).float().reshape(shape)
            continue
        packed, bins, centroids = part
        numel = weights[name].numel()
        n_full = numel // CHUNK
        tail_k = min(k, numel - n_full * CHUNK)
        idx = _unpack12(packed, n_full * k + tail_k).to(weights[name].device)
        sent = centroids.to(weights[name].device)[bins.long().to(weights[name].device)]
        co = torch.zeros(numel, dtype=torch.float32, device=weights[name].device)
        co[: n_full * CHUNK].view(n_full, CHUNK).scatter_(
            1, idx[: n_full * k].view(n_full, k), sent[: n_full * k].view(n_full, k)
        )
        co[n_full * CHUNK :][idx[n_full * k :]] = sent[n_full * k :]
        out[name] = _from_chunk_order(co, shape)
    return out


def _from_chunk_order(co: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if len(shape) == 2 and shape[0] % TILE == 0 and shape[1] % TILE == 0:
        rows, cols = shape
        return co.view(rows // TILE, cols // TILE, TILE, TILE).permute(0, 2, 1, 3).reshape(shape)
    return co.reshape(shape)


def reference_bytes(payload: dict[str, Any]) -> int:
    total = 0
    for part in payload.values():
        if isinstance(part, torch.Tensor):
            total += part.numel() * part.element_size()
        else:
            packed, bins, centroids = part
            total += packed.numel() + bins.numel() + 4 * centroids.numel()
    return total


# -- the measurement ------------------------------------------------------------------------


def speed_weights(
    model: str, device: torch.device, *, gpt: GPTConfig, seed: int, cache_dir: Path | None
) -> dict[str, torch.Tensor]:
    """BF16 weights of the model the speed table is measured on: `gpt` (seeded), or an `HF_MODELS`
    model (the first state of its cached trace, else seeded)."""
    if model == "gpt":
        return {n: t.to(device) for n, t in bf16_state(build_gpt(gpt, seed)).items()}
    trace = hf_trace_dir(cache_dir or default_cache_dir(), model, 1e-6)
    try:
        state = load_file(Path(trace) / read_manifest(trace)["files"][0]["file"])
    except (OSError, ValueError, KeyError, IndexError):
        state = bf16_state(build_hf_from_config(HF_MODELS[model], seed))
    return {n: t.to(device) for n, t in state.items()}


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def measure(
    compress: Callable[[], tuple[Any, Any]],
    decompress: Callable[[Any], Any],
    size: Callable[[Any], int],
    n: int,
    repeat: int,
    device: torch.device,
) -> dict[str, float]:
    """Speeds (GB of FP32 pseudo-gradient per second), peak extra memory (MB) and size of one codec."""
    with PeakMemory(device) as mem_c:
        payload, _ = compress()
    with PeakMemory(device) as mem_d:
        decompress(payload)
    best_c = best_d = float("inf")
    for _ in range(repeat):
        dt, (payload, _) = _timed(compress, device)
        best_c = min(best_c, dt)
        dt, _ = _timed(functools.partial(decompress, payload), device)
        best_d = min(best_d, dt)
    gb = 4 * n / 1e9
    return {
        "compress_gbps": gb / best_c,
        "decompress_gbps": gb / best_d,
        "compress_seconds": best_c,
        "decompress_seconds": best_d,
        "compress_peak_extra_mb": (mem_c.extra_bytes or 0) / 1e6,
        "decompress_peak_extra_mb": (mem_d.extra_bytes or 0) / 1e6,
        "payload_bytes": float(size(payload)),
    }


def _compress(codec: Codec, delta: State, error: State, weights: State) -> tuple[bytes, dict[str, torch.Tensor]]:
    payload, new_error, _ = codec.compress(delta, error, weights)
    return payload, new_error


def _decompress(codec: Codec, payload: bytes, *, weights: State) -> dict[str, torch.Tensor]:
    return codec.decompress(payload, weights)


def run_speed(
    model: str, device: torch.device, repeat: int, *, gpt: GPTConfig, seed: int, cache_dir: Path | None
) -> BenchResult:
    """The speed table of `model`'s weights (`speed_weights`) on `device`."""
    weights = speed_weights(model, device, gpt=gpt, seed=seed, cache_dir=cache_dir)
    rows = speed_rows(weights, device, repeat, seed)
    return _speed_result(model, device, sum(t.numel() for t in weights.values()), rows)


def speed_delta(weights: State, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """The seeded pseudo-gradient the speed table compresses: normal values of `DELTA_STD`."""
    gen = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(t.shape, generator=gen) * DELTA_STD).to(device) for n, t in weights.items()}


def speed_rows(weights: State, device: torch.device, repeat: int, seed: int) -> dict[str, dict[str, float]]:
    """`measure` of every codec of SPEED_CODECS and of the reference on `weights` (on `device`)."""
    delta = speed_delta(weights, device, seed)
    n = sum(t.numel() for t in weights.values())
    rows: dict[str, dict[str, float]] = {}
    for name, options in SPEED_CODECS.items():
        codec: Codec = make_codec(name, **options)
        error = codec.initial_error(weights)
        error = {k: v.to(device) for k, v in error.items()}
        rows[name] = measure(
            functools.partial(_compress, codec, delta, error, weights),
            functools.partial(_decompress, codec, weights=weights),
            len,
            n,
            repeat,
            device,
        )
        del error
    zeros = {k: torch.zeros_like(v) for k, v in delta.items()}
    rows["reference"] = measure(
        lambda: reference_compress(delta, zeros),
        lambda p: reference_decompress(p, weights),
        reference_bytes,
        n,
        repeat,
        device,
    )
    return rows


def _speed_result(model: str, device: torch.device, n: int, rows: dict[str, dict[str, float]]) -> BenchResult:
    total = {name: r["compress_seconds"] + r["decompress_seconds"] for name, r in rows.items()}
    summary: dict[str, Any] = {
        "model": model,
        "device": str(device),
        "params": n,
        "fp32_mb": 4 * n / 1e6,
        "codecs": rows,
        "sparseloco_vs_reference": total["reference"] / total["sparseloco"],
        "sparseloco_no_slower_than_reference": total["sparseloco"] <= total["reference"],
    }
    body = [
        [
            name,
            f"{r['compress_gbps']:.3f}",
            f"{r['decompress_gbps']:.3f}",
            f"{r['compress_seconds'] + r['decompress_seconds']:.2f}",
            f"{r['compress_peak_extra_mb']:.0f}",
            f"{r['decompress_peak_extra_mb']:.0f}",
            f"{8 * r['payload_bytes'] / n:.3f}",
        ]
        for name, r in rows.items()
    ]
    title = (
        f"loco --speed on {device}: {model} ({n / 1e6:.0f}M weights, {4 * n / 1e9:.2f} GB of FP32 "
        f"pseudo-gradient); GB/s of FP32 pseudo-gradient; peak MB above the start (decompress includes its "
        f"{4 * n / 1e6:.0f} MB output)"
    )
    columns = ["codec", "compress GB/s", "decompress GB/s", "both s", "compress MB", "decompress MB", "bits/weight"]
    verdict = table(
        "Target",
        ["target", "measured", "met"],
        [
            [
                "SparseLoCo compress+decompress <= the plain reference",
                f"{total['sparseloco']:.2f} s vs {total['reference']:.2f} s",
                summary["sparseloco_no_slower_than_reference"],
            ]
        ],
    )
    return BenchResult(summary=summary, tables=[table(title, columns, body), verdict])
