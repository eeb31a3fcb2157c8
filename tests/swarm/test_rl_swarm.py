"""An RL run on loopback: workers publish rollouts, miners train GRPO, the validator checks every batch.

Separate processes: bootstrap, validator, two miners, two honest inference workers (followers)
and two lying workers (false rewards; a made-up state hash). Every honest node must end on the
validator's state hash, every round's pool must hold only honest batches, and both liars must be
refused with their reason and left out of later pools.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.commands.roles import RL_CONFIG
from node.events.models import PoolPublished, RolloutsPublished, RolloutsRefused, Submitted
from node.run.manifest import parse_manifest
from node.swarm.demo import Proc, Swarm, summarize
from tests.helpers import events, wait_exits
from tests.swarm.runs import bootstrapped

pytestmark = pytest.mark.swarm
ROUNDS = 3
WAIT = 240.0


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[tuple[Swarm, Path, list[Path]]]:
    data: dict[str, Any] = tomllib.loads(RL_CONFIG.read_text())
    data["round"].update(deadline_seconds=30.0, min_seconds=0.0, checkpoint_every=2)
    data["train"]["inner_steps"] = 4
    data["rl"].update(warm_start_steps=40, held_out_prompts=16, prompts_per_batch=4, group_size=4)
    data["rl"].update(min_pool_batches=2, pool_wait_seconds=60.0)
    with bootstrapped(tmp_path, parse_manifest(data), miners=2, rounds=ROUNDS) as started:
        yield started


def start_liar(swarm: Swarm, name: str, lie: str) -> Proc:
    args = ["--lie", lie, "--config", str(swarm.out / "run.toml")]
    args += ["--events", str(swarm.out / "events" / f"{name}.jsonl")]
    args += ["--state-dir", str(swarm.work / name), "--rounds", str(ROUNDS)]
    args += ["--host", "/ip4/127.0.0.1/tcp/0", "--initial-peers", *swarm.bootstrap]
    return swarm.spawn(name, "follow", args, module="tests.swarm.lying_worker")


def test_rl_round_trip_with_lying_workers(swarm: tuple[Swarm, Path, list[Path]]) -> None:
    s, validator_key, miner_keys = swarm
    s.start_role("validator", "validator", validator_key)
    honest = [s.start_role(f"miner{i}", "miner", key) for i, key in enumerate(miner_keys)]
    honest += [s.start_role(f"worker{i}", "follow", None) for i in range(2)]
    liars = [start_liar(s, "liar_reward", "reward"), start_liar(s, "liar_state", "state")]

    wait_exits([proc.popen for proc in honest], WAIT)
    for proc in honest:
        assert proc.popen.returncode == 0, proc.log.read_text(errors="replace")[-2000:]
    for proc in liars:
        assert proc.popen.poll() in (None, 0), proc.log.read_text(errors="replace")[-2000:]

    records = events(s.out)
    summary = summarize(records, ROUNDS)
    assert summary["rounds"] == ROUNDS
    finals = summary["final_state_hashes"]
    assert set(finals) >= {"validator", "miner0", "miner1", "worker0", "worker1"}
    assert summary["hashes_agree"], finals
    assert summary["reward_first"] is not None and len(summary["reward_per_round"]) == ROUNDS

    keys = records.keys()
    workers = {keys["worker0"], keys["worker1"]}
    pools = records.events(PoolPublished, "validator")
    assert len(pools) == ROUNDS and all(p.batches >= 2 for p in pools)
    assert all(0 <= k <= 1 for p in pools for k in p.staleness)  # max_staleness
    refused = {e.worker: e.reason for e in records.events(RolloutsRefused)}
    assert "claimed reward" in refused[keys["liar_reward"]]
    assert "state other than" in refused[keys["liar_state"]]
    assert not workers & set(refused)  # honest workers are never refused
    pooled = {w for p in pools for w in p.workers}
    assert pooled <= workers and not pooled & {keys["liar_reward"], keys["liar_state"]}
    published = {r.name for r in records.of(RolloutsPublished)}
    assert {"worker0", "worker1"} <= published
    # over libp2p streams: the validator took the honest workers' batches as pushes
    assert all(e.pushed for w in ("worker0", "worker1") for e in records.events(RolloutsPublished, w))
    assert all(e.bytes > 0 for r in ("miner0", "miner1") for e in records.events(Submitted, r))
