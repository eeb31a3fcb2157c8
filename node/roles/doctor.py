"""`pulse doctor`: will this machine keep up with the run? Measured here and on the live network, then forecast.

    measured = await measure(setup, task, peer, steps=3, probe_bytes=8 << 20, folder=state_dir, device="cuda")
    report = forecast(measured, setup.manifest)      # `forecast.py`; report.advice: what to change

What is measured (nothing is assumed that can be measured):

- the machine (`machinefit.py`): `steps` inner steps of the run's model at the run's batch on
  `device` (the miner's own `Trainer`), timed and scaled to the run's H, their peak device memory;
  the pseudo-gradient they give, compressed with the run's codec; the process's peak host memory;
  GPU memory, host RAM and disk against what the run needs; the run's data and its digest;
- the links: a download and an upload probe (`net/ranges.py`) with the run's validator (or, failing
  that, the holder that answers first): what a miner's push and a joiner's pieces go through;
- the run, from its signed records: the open round, its target (the validator's open heartbeat),
  the round period (two consecutive open heartbeats), patch sizes (round results), payload sizes
  (the validator's round metrics), and the cheapest join plan (`joinplan.py`) with its bytes;
- reachability from this node's own addresses (public, private network only, or relayed);

The forecast from these figures, and the advice: `forecast.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from node.net.peer import Peer
from node.roles.chainstate import apply_patch
from node.roles.joinplan import plan_join
from node.roles.machinefit import Machine, probe_machine
from node.run.setup import RunSetup
from node.run.task import Task
from protocol import pulsesync
from protocol.errors import NetworkError, ProtocolError, TransferError
from protocol.messages import Heartbeat, RoundMetrics
from protocol.statehash import state_hash

HASH_PROBE_BYTES = 64 << 20
PERIOD_ROUNDS = 4


@dataclass
class Measured:
    """Everything `forecast` needs, each figure measured here or read from the run's signed records."""

    params: int
    state_bytes: int  # the BF16 weights
    step_seconds: float
    own_payload_bytes: int  # this machine's pseudo-gradient after the measured steps, compressed
    compress_seconds: float
    hash_bytes_per_second: float
    patch_apply_seconds: float  # one patch of the run's latest size applied here and its state hash checked
    lookup_seconds: float  # finding where the run is and pricing the join plan, as a join does first
    read_seconds: float  # one round result read from the DHT, as a join does before each patch
    current_round: int
    target_seconds: float  # the open round's (the deadline where the validator names none)
    round_seconds: float | None  # from the open heartbeats of recent rounds
    run_payload_bytes: float | None  # mean payload of the latest round, as the validator received it
    patch_bytes: int | None  # the latest round result's patch
    join_bytes: int | None  # the cheapest join plan: bytes still to fetch
    join_patches: int
    probed: str | None  # the peer the links were measured with
    down_bytes_per_second: float | None
    up_bytes_per_second: float | None
    reachability: str
    disk_free: int
    memory_available: int | None
    machine: Machine  # the steps on the device, peak memory, and what the machine has
    problems: list[str] = field(default_factory=list)  # what could not be measured, and why


async def measure(
    setup: RunSetup,
    task: Task,
    peer: Peer,
    *,
    steps: int,
    probe_bytes: int,
    folder: Path,
    reachability: str,
    device: str = "cpu",
) -> Measured:
    """Compute here (on `device`), then the run's records and the links to its validator."""
    m = setup.manifest
    problems: list[str] = []
    loop = asyncio.get_running_loop()
    machine = await loop.run_in_executor(
        None, lambda: probe_machine(setup, task, device=device, steps=steps, folder=folder)
    )
    hash_rate = await loop.run_in_executor(None, _hash_rate)
    looking = time.monotonic()
    current, announcement, head = await peer.position()  # the run head: one read at any round
    if head is not None:
        peer.validator_peer = head.validator_peer
    beat = await peer.validator_heartbeat(current)
    period = await _round_period(peer, beat, current)
    if beat is None:
        problems.append(f"no open heartbeat of the validator for round {current}: is the run live?")
    target = beat.target_seconds if beat is not None and beat.target_seconds else m.round.deadline_seconds
    metrics = await peer.from_validator(RoundMetrics, current - 1)
    reading = time.monotonic()
    result = await peer.round_result(current - 1)
    read = time.monotonic() - reading
    patch_bytes = result.patch_size if result is not None else None
    apply = await loop.run_in_executor(None, _patch_probe, task, patch_bytes)
    planning = time.monotonic()
    plan = await plan_join(peer, current, announcement)
    # a join starts with the same reads: where the run is, then the plan (the probes between are not)
    lookup = (reading - looking) + (time.monotonic() - planning)
    down, up, probed = await _probe(peer, current, probe_bytes, problems)
    return Measured(
        params=machine.params,
        state_bytes=2 * machine.params,
        step_seconds=machine.step_seconds,
        own_payload_bytes=machine.payload_bytes,
        compress_seconds=machine.compress_seconds,
        hash_bytes_per_second=hash_rate,
        patch_apply_seconds=apply,
        lookup_seconds=lookup,
        read_seconds=read,
        current_round=current,
        target_seconds=target,
        round_seconds=period,
        run_payload_bytes=metrics.received_bytes / metrics.submissions if metrics and metrics.submissions else None,
        patch_bytes=patch_bytes,
        join_bytes=plan.bytes_needed if plan is not None else None,
        join_patches=plan.behind if plan is not None else 0,
        probed=probed,
        down_bytes_per_second=down,
        up_bytes_per_second=up,
        reachability=reachability,
        disk_free=machine.disk_free_bytes,
        memory_available=machine.host_available_bytes,
        machine=machine,
        problems=problems,
    )


async def _round_period(peer: Peer, beat: Heartbeat | None, current: int) -> float | None:
    """Seconds per round: the validator's open heartbeats of up to `PERIOD_ROUNDS` rounds apart
    (their times are whole seconds, so one round apart says little about short rounds)."""
    if beat is None:
        return None
    for back in range(min(PERIOD_ROUNDS, current), 0, -1):
        before = await peer.from_validator(Heartbeat, current - back)
        if before is not None and beat.sent_at > before.sent_at:
            return (beat.sent_at - before.sent_at) / back
    return None


def _patch_probe(task: Task, patch_bytes: int | None) -> float:
    """Seconds to apply a patch like the run's latest (a share of values nudged by one BF16 step, the
    share from its size) to the run's state, the new state's hash checked, as a join does."""
    weights = {name: t.to(torch.bfloat16) for name, t in task.initial_master().items()}
    total = sum(t.numel() for t in weights.values())
    share = min(1.0, max(1e-4, (patch_bytes or 0) / max(total, 1)))
    gen = torch.Generator().manual_seed(0)
    new = {}
    for name, t in weights.items():
        nudge = (torch.rand(t.shape, generator=gen) < share).to(torch.int16)
        new[name] = (t.contiguous().view(torch.int16) + nudge).view(torch.bfloat16)
    old_hash, new_hash = state_hash(weights), state_hash(new)
    patch = pulsesync.encode(weights, new, old_hash=old_hash, new_hash=new_hash)
    start = time.monotonic()
    apply_patch(weights, old_hash, patch, new_hash)  # as a join applies it: the held state's hash is known
    return time.monotonic() - start


def _hash_rate() -> float:
    data = os.urandom(HASH_PROBE_BYTES)
    start = time.monotonic()
    hashlib.sha256(data).digest()
    return HASH_PROBE_BYTES / max(time.monotonic() - start, 1e-6)


async def _probe(
    peer: Peer, current: int, size: int, problems: list[str]
) -> tuple[float | None, float | None, str | None]:
    """Download and upload rates with the validator (else any live peer of the run)."""
    candidates = [peer.validator_peer] if peer.validator_peer else []
    for r in (current, current - 1):
        candidates += [v.message.peer_id for v in await peer.get(Heartbeat, r)]
    for holder in [c for c in dict.fromkeys(candidates) if c and c != peer.peer_id]:
        try:
            down, up = await peer.probe(holder, size, size)
            return down, up, holder
        except (TransferError, ProtocolError, NetworkError, TimeoutError) as exc:
            problems.append(f"probing {holder[:16]} failed: {exc}")
    problems.append("no live peer answered a link probe: the forecast has no link speeds")
    return None, None, None


def reachability(maddrs: list[str]) -> str:
    """How peers can reach this node, from the addresses it listens on and announces."""
    if any("/p2p-circuit" in a for a in maddrs):
        return "through a relay only: peers reach this node via a relay; transfers may be slower"
    ips = []
    for a in maddrs:
        parts = a.split("/")
        if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
            try:
                ips.append(ipaddress.ip_address(parts[2]))
            except ValueError:
                continue
    if any(ip.is_global for ip in ips):
        return "direct: a public address; peers can dial this node"
    if any(not ip.is_loopback for ip in ips):
        return (
            "private network only: peers on the same network can dial this node; from the internet it "
            "needs a relay (on by default), a forwarded port with --announce, or --client-mode"
        )
    return "loopback only: no other machine can reach this node (--host)"
