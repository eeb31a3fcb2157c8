"""gpu: every figure of the device data path in one prepared run, on the best device here.

One command for a lent GPU: `pulse bench gpu --json` measures, on CUDA when there is one,

- PULSESync on a pair of 0.5B states (the first pair of the cached `pulse bench sync --model
  qwen2-0.5b` trace, made with one AdamW step on the device if it is missing): encode, decode and
  `apply` with both hash checks, the plain encoding's encode and decode, in GB of BF16 state per
  second (sync.py's `measure_pair`, each phase the fastest of `--repeat`);
- PULSELoCo and SparseLoCo compress and decompress of one payload on the same weights, and the
  plain torch device reference (locospeed.py's `speed_rows`), in seconds;
- a validator round of 8 and of 16 submissions and a miner's round at the home-GPU preset's
  settings (scale.py: real miners, `Validator.run_round`, scaled to the preset where smaller);
- a swarm of `--swarm-rounds` rounds on this one device (`pulse demo --device ...`, separate
  processes on loopback): how many rounds closed and whether every node ended on one state hash.

`--budget-seconds` fits the check to a lent GPU's minutes: the round of 16 is skipped once the
round of 8 has spent the budget, and the swarm gets what is left (none under a minute); each part
that ran still reports. Without a GPU (or with `--small`) the same run measures a clearly smaller model of the same
architecture on the CPU (`SMALL`, about 1.6M parameters, seeded; the swarm is the embedded
default) and says so in `note`: the figures then check the machinery, not the targets.
The JSON object holds at least `device`, `sync_*_gbps`, `plain_*_gbps`,
`loco_seconds_per_payload`, `validator_seconds_8`, `validator_seconds_16`,
`miner_seconds_per_round`, `swarm_rounds` and `swarm_hashes_agree`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from node.bench import locospeed, scale, sync
from node.bench.report import BenchResult, table
from node.bench.trace import HF_MODELS, hf_trace_dir, make_hf_trace, read_manifest, trace_pairs
from node.learn.basecache import default_cache_dir
from node.learn.hfmodel import QWEN2_5_0_5B, build_hf_from_config
from node.learn.train import bf16_state
from node.run.presets import preset
from protocol import pulsesync
from protocol.codec import make_codec
from protocol.parsing import STRICT
from protocol.state import StateDict

log = logging.getLogger(__name__)

SMALL: dict[str, Any] = {  # Qwen2's architecture, small enough for a CPU run in seconds
    **QWEN2_5_0_5B,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "max_window_layers": 2,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
TRACE_MODEL = "qwen2-0.5b"
SWARM_PRESET = "qwen2.5-0.5b-seeded"  # the 0.5B swarm on one GPU
SMALL_STEP = 2e-6  # the small pair: one step of this size x sign on seeded weights (a few % of weights change)


class Options(BaseModel):
    """`pulse bench gpu`'s options."""

    model_config = STRICT

    device: str | None = None
    """cuda or cpu (default: cuda if there is one)"""
    small: bool = False
    """the small model even on a GPU (implied on a CPU)"""
    repeat: int = Field(default=2, ge=1)
    """timing repeats of the codecs; the fastest counts"""
    swarm_rounds: int = Field(default=5, ge=0)
    """rounds of the one-device swarm (0: skip it)"""
    swarm_timeout: float = Field(default=240.0, gt=0, allow_inf_nan=False)
    """give the swarm up after this many s"""
    miners: int = Field(default=2, ge=1)
    """miners that train in the validator rounds"""
    budget_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """the whole check's time (a lent GPU's minutes): the round of 16 is skipped once the round of 8
    has spent it, and the swarm gets what is left, or is skipped under a minute (0: no limit)"""
    cache_dir: Path | None = None
    """trace cache ($PULSE_CACHE_DIR)"""
    seed: int = 0
    """seed of the weights and the pseudo-gradient"""


def run(options: Options) -> BenchResult:
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pulse bench gpu: --device cuda, but this torch build sees no CUDA device")
    small = options.small or device.type != "cuda"
    started = time.perf_counter()
    summary: dict[str, Any] = {"device": _device_name(device), "small": small}
    if small:
        summary["note"] = "small model on this device: checks the machinery, the targets are for one GPU at 0.5B"
    with tempfile.TemporaryDirectory(prefix="pulse-gpu-") as tmp:
        pair = _stage(summary, "states", lambda: _sync_pair(options, device, small, Path(tmp)))
        if pair is not None:
            old, new, summary["sync_states"] = pair
            _stage(summary, "sync", lambda: _sync_figures(old, new, options.repeat))
            _stage(summary, "codecs", lambda: {"loco_seconds_per_payload": _loco_figures(old, device, options)})
            if device.type != "cpu":
                _stage(summary, "same_as_host", lambda: _same_as_host(old, new, options.seed))
            del old, new, pair
        _stage(summary, "rounds", lambda: _scale_figures(options, device, small, Path(tmp), left(started, options)))
        _stage(summary, "swarm", lambda: _swarm_figures(options, device, small, Path(tmp), left(started, options)))
    summary["seconds"] = time.perf_counter() - started
    return BenchResult(summary, _tables(summary))


def left(started: float, options: Options) -> float | None:
    """Seconds of `--budget-seconds` still left (None: no budget)."""
    if not options.budget_seconds:
        return None
    return options.budget_seconds - (time.perf_counter() - started)


def _stage(summary: dict[str, Any], name: str, measure: Callable[[], Any]) -> Any:
    """Run one part of the check. A part that fails is logged with its traceback and named in
    `errors`, and the parts after it still run: on a lent GPU the minutes are few, and one broken
    part must not cost the figures of the others. Each part's figures are logged as it ends, so a
    run cut short still says what it measured."""
    start = time.perf_counter()
    try:
        got = measure()
    except Exception as e:  # any failure: reported in the result, and the check goes on
        log.exception("pulse bench gpu: %s failed after %.1f s", name, time.perf_counter() - start)
        summary.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
        return None
    figures = got if isinstance(got, dict) else {}
    summary.update(figures)
    log.info("pulse bench gpu: %s in %.1f s %s", name, time.perf_counter() - start, json.dumps(figures, default=str))
    return got


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return "cpu"


def _sync_pair(options: Options, device: torch.device, small: bool, tmp: Path) -> tuple[StateDict, StateDict, str]:
    """(old, new) BF16 states on `device`, and where they come from."""
    if small:
        model = build_hf_from_config(SMALL, options.seed)
        master = {n: p.detach().float() for n, p in model.state_dict().items()}
        gen = torch.Generator().manual_seed(options.seed + 1)
        old = bf16_state(model)
        new = {
            n: (master[n] - SMALL_STEP * torch.randn(t.shape, generator=gen).sign()).bfloat16() for n, t in old.items()
        }
        return _on(old, device), _on(new, device), f"small seeded model, one step of {SMALL_STEP:g} x sign"
    trace = hf_trace_dir(options.cache_dir or default_cache_dir(), TRACE_MODEL, 1e-6)
    try:
        read_manifest(trace)
    except (OSError, ValueError, KeyError):
        trace = tmp / "trace"
        make_hf_trace(trace, TRACE_MODEL, 1e-6, 1, device=str(device))
    old, new = next(trace_pairs(trace, 1))
    return (
        _on(old, device),
        _on(new, device),
        f"{TRACE_MODEL} trace, lr 1e-6, first pair ({HF_MODELS[TRACE_MODEL]['hidden_size']} wide)",
    )


def _on(state: StateDict, device: torch.device) -> StateDict:
    return {n: t.to(device) for n, t in state.items()}


def _sync_figures(old: StateDict, new: StateDict, repeat: int) -> dict[str, Any]:
    device = next(iter(old.values())).device
    sync.warm_up(device)
    totals, times, peaks = sync.new_tallies()
    sync.measure_pair(old, new, repeat, totals, times, peaks)
    gb = 2 * totals["elements"] / 1e9
    state_bytes = 2 * totals["elements"]
    return {
        "params": int(totals["elements"]),
        "sync_density": totals["changed"] / max(totals["elements"], 1.0),
        "sync_lossless": totals["lossless"] == 1,
        "sync_encode_gbps": gb / times["enc"],
        "sync_decode_gbps": gb / times["dec"],
        "sync_apply_gbps": gb / times["apply"],
        "plain_encode_gbps": gb / times["base_enc"],
        "plain_decode_gbps": gb / times["base_dec"],
        "memcpy_gbps": gb / times["memcpy"],
        "sync_bits_per_changed": 8 * totals["bytes"] / max(totals["changed"], 1.0),
        "sync_coder_seconds_per_million_changed": 1e6 * totals["coder_seconds"] / max(totals["changed"], 1.0),
        "sync_host_peak_extra_share": max(peaks["encode"], peaks["apply"]) / state_bytes,
        "sync_device_peak_extra_share": peaks["device"] / state_bytes,
    }


def _loco_figures(weights: StateDict, device: torch.device, options: Options) -> dict[str, dict[str, float]]:
    rows = locospeed.speed_rows(weights, device, options.repeat, options.seed)
    return {
        name: {
            "compress": r["compress_seconds"],
            "decompress": r["decompress_seconds"],
            "payload_bytes": r["payload_bytes"],
        }
        for name, r in rows.items()
    }


def _same_as_host(old: StateDict, new: StateDict, seed: int) -> dict[str, bool]:
    """Whether the device paths give exactly what the host paths give on the same inputs: the
    PULSESync patch byte for byte, and each codec's decoded update bit for bit (a device payload
    decoded where it was made and on the host). The tests check this on CPU tensors; here it is
    checked where the device's own kernels run."""
    host_old, host_new = _on(old, torch.device("cpu")), _on(new, torch.device("cpu"))
    figures = {"sync_patch_same_as_host": pulsesync.encode(old, new) == pulsesync.encode(host_old, host_new)}
    del host_new
    delta = locospeed.speed_delta(old, next(iter(old.values())).device, seed)
    for name, codec_options in locospeed.SPEED_CODECS.items():
        codec = make_codec(name, **codec_options)
        payload, _, _ = codec.compress(delta, None, old)
        here, there = codec.decompress(payload, old), codec.decompress(payload, host_old)
        figures[f"{name}_decode_same_as_host"] = all(torch.equal(here[n].cpu(), there[n]) for n in here)
        del here, there
    return figures


def _scale_figures(
    options: Options, device: torch.device, small: bool, tmp: Path, budget: float | None = None
) -> dict[str, Any]:
    """Validator rounds of 8 and 16 and a miner's round (scale.py), at the preset's settings on a GPU;
    with a `budget` (seconds left), the round of 16 is skipped once it is spent."""
    model_dir = None
    if small:
        model_dir = tmp / "small-model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(SMALL))
    s = _scale_summary(device, options.miners, model_dir, max(budget, 1.0) if budget is not None else 0.0)
    by_size = {r["submissions"]: r for r in s["rounds"]}
    out: dict[str, Any] = {
        f"validator_seconds_{n}": r["seconds_at_preset"] for n, r in by_size.items()
    }  # a skipped round leaves its figure out
    return out | {
        "validator_seconds_run": {n: r["seconds_run"] for n, r in by_size.items()},
        "validator_steps": {n: {k: v["seconds"] for k, v in r["steps"].items()} for n, r in by_size.items()},
        "validator_rounds_skipped": s.get("skipped_rounds", []),
        "miner_seconds_per_round": s["miner_seconds_per_round"],
        "validator_keeps_up": by_size[8]["seconds_at_preset"] < s["miner_seconds_per_round"],
        "rounds_scaled_to_preset": s["scaled"],
        "validator_device_peak_mb": s["validator_device_peak_mb"],
    }


def _scale_summary(device: torch.device, miners: int, model_dir: Path | None, budget: float = 0.0) -> dict[str, Any]:
    """scale.py's summary of validator rounds of 8 and 16 submissions, `miners` of them trained."""
    flags = {
        "device": device.type, "miners": miners, "submissions": "8,16", "model_dir": model_dir,
        "budget_seconds": budget,
    }  # fmt: skip
    return scale.run(scale.Options.model_validate(flags)).summary


def _swarm_figures(
    options: Options, device: torch.device, small: bool, tmp: Path, budget: float | None = None
) -> dict[str, Any]:
    """`pulse demo` on this device for `--swarm-rounds` rounds: rounds closed, hashes agree; within
    `budget` seconds if given (skipped under a minute)."""
    if options.swarm_rounds <= 0:
        return {"swarm_rounds": 0, "swarm_hashes_agree": None, "swarm_skipped": True}
    timeout = options.swarm_timeout if budget is None else min(options.swarm_timeout, budget - 30)
    if budget is not None and timeout < 60:
        log.warning("pulse bench gpu: the swarm skipped, %.0f s of the budget left", budget or 0)
        return {"swarm_rounds": 0, "swarm_hashes_agree": None, "swarm_skipped": "budget spent"}
    out = tmp / "swarm"
    cmd = [sys.executable, "-m", "node", "demo", "--rounds", str(options.swarm_rounds), "--miners", "2"]
    cmd += ["--out", str(out), "--device", device.type, "--timeout", f"{timeout:.0f}"]
    if not small:
        cmd += ["--config", str(preset(SWARM_PRESET))]
    started = time.perf_counter()
    with contextlib.suppress(subprocess.TimeoutExpired):  # what it wrote so far still says how far it got
        subprocess.run(cmd, capture_output=True, timeout=timeout + 30, check=False)
    seconds = time.perf_counter() - started
    try:
        report = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {"swarm_rounds": 0, "swarm_hashes_agree": False, "swarm_seconds": seconds}
    return {
        "swarm_rounds": int(report.get("rounds", 0)),
        "swarm_hashes_agree": bool(report.get("hashes_agree", False)),
        "swarm_seconds": seconds,
        "swarm_role_seconds": report.get("role_seconds", {}),
        "swarm_loss": [report.get("loss_first"), report.get("loss_last")],
    }


def _tables(s: dict[str, Any]) -> list[Any]:
    def get(key: str) -> Any:  # a part that failed leaves its figures out
        return s.get(key, "-")

    sync_rows = [
        ["PULSESync", get("sync_encode_gbps"), get("sync_decode_gbps"), get("sync_apply_gbps")],
        ["plain", get("plain_encode_gbps"), get("plain_decode_gbps"), ""],
        ["memcpy (both states once)", get("memcpy_gbps"), get("memcpy_gbps"), ""],
    ]
    loco = [
        [name, r["compress"], r["decompress"], r["payload_bytes"]]
        for name, r in s.get("loco_seconds_per_payload", {}).items()
    ]
    rounds = [
        ["validator, round of 8", get("validator_seconds_8")],
        ["validator, round of 16", get("validator_seconds_16")],
        ["miner, one round", get("miner_seconds_per_round")],
        ["swarm rounds closed", get("swarm_rounds")],
        ["swarm hashes agree", get("swarm_hashes_agree")],
    ]
    roles: dict[str, dict[str, float]] = s.get("swarm_role_seconds") or {}
    rounds += [[f"swarm {role}: {phase} (s)", v] for role, phases in roles.items() for phase, v in phases.items()]
    rounds += [[key.replace("_", " "), v] for key, v in s.items() if key.endswith("_same_as_host")]
    rounds += [[f"failed: {part}", why] for part, why in s.get("errors", {}).items()]
    params = s.get("params")
    size = f", {params / 1e6:.1f}M parameters" if params else ""
    title = f"Device data path on {s['device']}{size}" + (" (small)" if s["small"] else "")
    return [
        table(
            title + ": PULSESync, GB/s of BF16 state", ["codec", "encode", "decode", "apply (both hashes)"], sync_rows
        ),
        table("Pseudo-gradient codecs, seconds per payload", ["codec", "compress", "decompress", "bytes"], loco),
        table("Rounds (seconds at the preset's settings) and checks", ["what", "value"], rounds),
    ]
