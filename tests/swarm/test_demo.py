"""`pulse demo` end to end: a small swarm of processes, its JSON summary and its report files."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from node.commands.cli import main
from node.commands.roles import DEFAULT_CONFIG
from node.swarm.demo import Proc, Swarm

pytestmark = [pytest.mark.swarm, pytest.mark.light]


def test_demo_json_summary(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "node", "demo", "--miners", "2", "--rounds", "2", "--out", str(tmp_path), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["rounds"] == 2 and summary["hashes_agree"] and summary["clean_shutdown"]
    assert summary["loss_last"] < summary["loss_first"]
    assert summary["bytes_ratio_vs_dense"] > 17
    assert 0 < summary["miner_busy_fraction"] <= 1
    assert set(summary["peak_rss_mb"]) >= {"validator", "miner", "follow"}
    times = summary["role_seconds"]  # per-role phase times, each a positive mean
    assert {"step", "compress", "apply_patch"} <= set(times["miner"]) and {"decide", "round"} <= set(times["validator"])
    assert all(v >= 0 for phases in times.values() for v in phases.values()) and times["validator"]["round"] > 0
    for name in ("summary.json", "loss.png", "bytes.png", "leaderboard.png"):
        assert (tmp_path / name).stat().st_size > 0
    places = summary["places_per_round"]  # every aggregated miner has a place in its rounds
    assert set(places) <= {"miner0", "miner1"} and all(len(row) == 2 for row in places.values())
    assert any(p == 1 for row in places.values() for p in row)
    # the validator's state folder stays, and exports
    out = tmp_path / "model"
    flags = ["--state-dir", str(tmp_path / "validator"), "--config", str(tmp_path / "run.toml"), "--out", str(out)]
    assert main(["export", *flags]) == 0 and main(["export", "--verify", str(out)]) == 0


def test_demo_rl_json_summary(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "node", "demo", "--task", "rl", "--miners", "2", "--rounds", "2"]
    done = subprocess.run([*cmd, "--out", str(tmp_path), "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["rounds"] == 2 and summary["hashes_agree"] and summary["clean_shutdown"]
    assert {"follower", "follower1"} <= set(summary["final_state_hashes"])  # two inference workers
    assert summary["reward_first"] is not None and len(summary["reward_per_round"]) == 2
    assert 0 < summary["mean_patch_density"] < 1 and summary["sync_ratio_vs_dense"] > 1
    for name in ("summary.json", "reward.png", "bytes.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_demo_refuses_a_manifest_of_the_other_task(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "node", "demo", "--task", "rl", "--config", str(DEFAULT_CONFIG)]
    done = subprocess.run([*cmd, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "is a task 'lm' manifest, not 'rl'" in done.stderr


def test_demo_of_a_seeded_model_from_its_config_alone(tmp_path: Path) -> None:
    """The 0.5B seeded preset's recipe (BF16 moments, checkpointing, PULSELoCo) on a toy Qwen2
    architecture from a config.json alone, `--device` passed to every role."""
    from node.run.manifest import load_manifest, parse_manifest
    from node.run.presets import preset
    from tests.models import TINY_QWEN

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_QWEN))
    data = load_manifest(preset("qwen2.5-0.5b-seeded")).model_dump(mode="python")
    data["model"].update(architecture=None, path=str(tmp_path / "model"))
    data["data"].update(batch_size=2, seq_len=32)
    data["train"]["inner_steps"] = 2
    data["round"].update(deadline_seconds=30.0, min_seconds=0.0)
    data["selection"].update(eval_batch_size=2, held_out_batches=1, assignment_batches=2)
    config = tmp_path / "seeded.toml"
    config.write_text(parse_manifest(data).to_toml())
    cmd = [sys.executable, "-m", "node", "demo", "--config", str(config), "--miners", "2", "--rounds", "2"]
    done = subprocess.run(
        [*cmd, "--device", "cpu", "--out", str(tmp_path / "out"), "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["rounds"] == 2 and summary["hashes_agree"] and summary["clean_shutdown"]
    logs = "".join(p.read_text() for p in (tmp_path / "out" / "logs").glob("*.log"))
    assert "tokens are bytes" in logs and "--device" not in done.stderr


def test_demo_on_cuda_needs_a_cuda_torch(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cmd = [sys.executable, "-m", "node", "demo", "--device", "cuda", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr


def _sessions_of(folder: Path) -> dict[int, int]:
    """{pid: session id} of every process whose command line names `folder` (the demo's roles)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        if str(folder).encode() in cmdline:
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[3])
    return found


def _in_sessions(sessions: set[int]) -> list[int]:
    """Processes still alive (zombies aside) in any of `sessions`: roles, their DHT processes, their daemons."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sessions and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


def _wait_gone(sessions: set[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := _in_sessions(sessions)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def test_a_failed_start_reaps_every_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The follower fails to start after the DHT, the validator and the miners did: `pulse demo`
    says why, and none of them (nor their DHT processes and daemons) is left running."""
    started: list[Proc] = []
    real = Swarm.start_role

    def start_role(self: Swarm, name: str, role: str, key: Path | None, **kw: Any) -> Proc:
        if role == "follow":
            raise RuntimeError("the follower could not start (forced by the test)")
        proc = real(self, name, role, key, **kw)
        started.append(proc)
        return proc

    monkeypatch.setattr(Swarm, "start_role", start_role)
    code = main(["demo", "--miners", "2", "--rounds", "1", "--out", str(tmp_path), "--json"])
    assert code == 1
    assert [p.role for p in started] == ["validator", "miner", "miner"]
    assert all(p.popen.poll() is not None for p in started)
    assert _wait_gone(set(_sessions_of(tmp_path).values()) | {p.popen.pid for p in started}, 5.0) == []


def test_roles_stop_when_the_demo_is_killed(tmp_path: Path) -> None:
    """SIGKILL on `pulse demo` mid-run (no `finally` runs): every role still stops, by the signal
    its parent's death sends it."""
    cmd = [sys.executable, "-m", "node", "demo", "--miners", "2", "--rounds", "50", "--out", str(tmp_path), "--json"]
    demo = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, own = time.monotonic() + 120, os.getsid(0)
        roles: set[int] = set()
        while len(roles) < 5 and time.monotonic() < deadline:  # dht, validator, 2 miners, follower
            time.sleep(0.5)
            roles = set(_sessions_of(tmp_path).values()) - {own}
        assert len(roles) >= 5, f"the demo started {len(roles)} roles"
    finally:
        demo.kill()
        demo.wait()
    try:
        assert _wait_gone(roles, 60.0) == []
    finally:  # reap what a failure left, as the swarm tier's teardown does
        for sid in roles:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sid, signal.SIGKILL)
