"""`pulse bench gpu` at a tiny size on the CPU: one JSON object with every figure the GPU check reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from node.bench import gpu
from node.commands.cli import main

KEYS = {
    "device",
    "sync_encode_gbps",
    "sync_decode_gbps",
    "sync_apply_gbps",
    "plain_encode_gbps",
    "plain_decode_gbps",
    "loco_seconds_per_payload",
    "validator_seconds_8",
    "validator_seconds_16",
    "miner_seconds_per_round",
    "swarm_rounds",
    "swarm_hashes_agree",
}


def test_gpu_bench_writes_every_figure_at_a_tiny_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = {**gpu.SMALL, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 512}
    monkeypatch.setattr(gpu, "SMALL", tiny)
    argv = ["bench", "gpu", "--json", "--device", "cpu", "--repeat", "1", "--miners", "1", "--swarm-rounds", "0"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s.keys() >= KEYS
    assert s["device"] == "cpu" and s["small"] and "note" in s
    assert s["sync_lossless"] and 0 < s["sync_density"] < 0.5
    for key in ("sync_encode_gbps", "sync_decode_gbps", "sync_apply_gbps", "plain_encode_gbps", "plain_decode_gbps"):
        assert 0 < s[key] < 1000, key
    assert set(s["loco_seconds_per_payload"]) == {"sparseloco", "pulseloco", "reference"}
    for row in s["loco_seconds_per_payload"].values():
        assert row["compress"] > 0 and row["decompress"] > 0 and row["payload_bytes"] > 0
    assert s["validator_seconds_8"] > 0 and s["validator_seconds_16"] > 0 and s["miner_seconds_per_round"] > 0
    assert s["swarm_rounds"] == 0 and s["swarm_hashes_agree"] is None  # skipped here: a swarm is the swarm tier's


def test_swarm_figures_come_from_the_demo_summary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The swarm part runs `pulse demo` on the device and reads its summary; no summary (a demo
    that died or timed out before writing one) reports no rounds and no agreement."""
    calls: list[list[str]] = []

    def fake_demo(cmd: list[str], **_: object) -> None:
        calls.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps({"rounds": 5, "hashes_agree": True}))

    monkeypatch.setattr(gpu.subprocess, "run", fake_demo)
    options = gpu.Options(swarm_rounds=5, swarm_timeout=30.0)
    got = gpu._swarm_figures(options, torch.device("cuda"), False, tmp_path)
    assert got["swarm_rounds"] == 5 and got["swarm_hashes_agree"] is True
    assert "--config" in calls[0] and calls[0][calls[0].index("--device") + 1] == "cuda"
    monkeypatch.setattr(gpu.subprocess, "run", lambda cmd, **_: None)
    got = gpu._swarm_figures(options, torch.device("cpu"), True, tmp_path / "again")
    assert got["swarm_rounds"] == 0 and got["swarm_hashes_agree"] is False


def test_a_failed_part_is_reported_and_the_others_still_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One broken part (here the rounds) is named in `errors` with its reason; the codec figures
    before it and the swarm part after it are still measured, and the command still prints its result."""
    tiny = {**gpu.SMALL, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 512}
    monkeypatch.setattr(gpu, "SMALL", tiny)

    def broken(*_: object) -> dict[str, float]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu, "_scale_figures", broken)
    argv = ["bench", "gpu", "--json", "--device", "cpu", "--repeat", "1", "--swarm-rounds", "0"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["errors"] == {"rounds": "RuntimeError: CUDA error: an illegal memory access was encountered"}
    assert "validator_seconds_8" not in s
    assert s["sync_lossless"] and s["sync_encode_gbps"] > 0 and set(s["loco_seconds_per_payload"]) >= {"pulseloco"}
    assert s["swarm_rounds"] == 0


def test_device_paths_match_the_host_paths_on_the_small_pair() -> None:
    """The cross-check a GPU run makes (patch bytes, decoded updates) holds where both sides are the
    host, and it reads every codec of the speed table."""
    tiny = {**gpu.SMALL, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 512}
    model = gpu.build_hf_from_config(tiny, 0)
    old = gpu.bf16_state(model)
    new = {n: (t.float() * 1.001).bfloat16() for n, t in old.items()}
    got = gpu._same_as_host(old, new, 0)
    assert got == {
        "sync_patch_same_as_host": True,
        "sparseloco_decode_same_as_host": True,
        "pulseloco_decode_same_as_host": True,
    }


def test_a_budget_skips_the_round_of_16_and_the_swarm(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lent GPU has minutes: past `--budget-seconds` the round of 16 is skipped (the round of 8 and
    its figures kept, the skip named), and a swarm with under a minute left is not started."""
    tiny = {**gpu.SMALL, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 512}
    monkeypatch.setattr(gpu, "SMALL", tiny)
    started: list[list[str]] = []
    monkeypatch.setattr(gpu.subprocess, "run", lambda cmd, **_: started.append(cmd))
    argv = ["bench", "gpu", "--json", "--device", "cpu", "--repeat", "1", "--miners", "1", "--budget-seconds", "1"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["validator_seconds_8"] > 0 and "validator_seconds_16" not in s and s["validator_rounds_skipped"] == [16]
    assert s["swarm_skipped"] == "budget spent" and s["swarm_rounds"] == 0 and not started
    assert "errors" not in s
