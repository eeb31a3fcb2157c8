"""The in-process round harness: whole runs of the real roles on one in-memory network.

    h = Harness(root, lm_manifest())      # or the `round_harness` fixture (`conftest.py`)
    h.start_validator(); h.start_miner("miner0"); h.start_follower("follower")
    await h.until("round 2", lambda log: log.has(RoundClosed, "validator", 2))
    await h.stop()

Keys come from labels (`key`), so a test names its nodes and finds their keys again; the manifests
are tiny GPT runs that close rounds in seconds on one CPU thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.events import EventLog, Events, read_events
from node.net.memory import MemoryNetwork
from node.roles.catchup import Held
from node.roles.intake import Clock, RoundIntake
from node.roles.records import run_records
from node.roles.tasks import follower_for, miner_for, validator_for
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.identity import Identity
from tests.helpers import apoll

POLL = 0.05
TIMEOUT = 120.0
SELECTION = {
    "top_g": 4,
    "assignment_batches": 1,
    "random_batches": 1,
    "eval_batch_size": 2,
    "min_indicator_average": 0.0,
}


def key(label: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(f"pulse-test-in-process/{label}".encode()).digest())


def lm_manifest() -> Manifest:
    return Manifest.model_validate(
        {
            "name": "in-process",
            "validators": [key("validator").public_hex],
            "model": {"gpt": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32}},
            "data": {"batch_size": 4, "seq_len": 32},
            "train": {"inner_steps": 2, "inner": {"lr": 3e-3}},
            "round": {"deadline_seconds": 20.0, "checkpoint_every": 2},
            "selection": {**SELECTION, "held_out_batches": 1},
        }
    )


def rl_manifest() -> Manifest:
    return Manifest.model_validate(
        {
            "name": "in-process-rl",
            "validators": [key("validator").public_hex],
            "task": "rl",
            "model": {"gpt": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32}},
            "data": {"batch_size": 4, "seq_len": 16},
            "train": {"inner_steps": 2, "overlap": False, "codec": "pulseloco", "inner": {"lr": 1e-3}},
            "round": {"deadline_seconds": 20.0, "checkpoint_every": 2},
            "selection": {**SELECTION, "held_out_batches": 0},
            "rl": {
                "warm_start_steps": 3,
                "held_out_prompts": 8,
                "prompts_per_batch": 2,
                "group_size": 2,
                "groups_per_batch": 2,
                "min_pool_batches": 2,
                "pool_wait_seconds": 10.0,
            },
        }
    )


class Harness:
    """One run on one in-memory network; each role gets a folder and an event file under `root`. The
    roles run `rounds` rounds; `stop` cancels what still runs and leaves the network."""

    rounds = 3

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = root
        self.setup = RunSetup.from_manifest(manifest)
        self.task = task_for(self.setup)
        self.network = MemoryNetwork(run_records(manifest))
        self.running: list[asyncio.Future[Any]] = []

    def events(self, name: str, role: str) -> Events:
        return Events(role, self.root / "events" / f"{name}.jsonl")

    def start_validator(self, clock: Clock = time.time) -> None:
        """The validator service; `clock`: its wall clock (a skewed one for clock-skew cases)."""
        me = key("validator")
        events, folder = self.events("validator", "validator"), self.root / "validator"
        intake = RoundIntake(self.setup, events, folder / "inbox", clock=clock)
        peer = self.network.join(me, folder, role="validator", intake=intake)
        service = validator_for(self.setup, self.task, me, folder, peer, events, intake, poll=POLL)
        self.running.append(asyncio.ensure_future(service.run(self.rounds)))

    def start_miner(self, name: str, uplink: float | None = None) -> asyncio.Future[Held]:
        """A miner; `uplink`: bytes/s its streams share (None: no limit)."""
        me = key(name)
        peer = self.network.join(me, self.root / name, role="miner")
        if uplink is not None:
            self.network.uplink[peer.peer_id] = uplink
        miner = miner_for(self.setup, self.task, me, peer, self.events(name, "miner"), poll=POLL)
        return self._start(miner.run(self.rounds))

    def start_follower(self, name: str) -> asyncio.Future[Held]:
        me = key(name)
        peer = self.network.join(me, self.root / name, role="follower")
        follower = follower_for(self.setup, self.task, me, peer, self.events(name, "follow"), poll=POLL)
        return self._start(follower.run(self.rounds))

    def _start(self, work: Any) -> asyncio.Future[Held]:
        future = asyncio.ensure_future(work)
        self.running.append(future)
        return future

    def log(self) -> EventLog:
        return read_events(self.root / "events")

    async def until(self, what: str, found: Callable[[EventLog], bool]) -> None:
        assert await apoll(lambda: found(self.log()), TIMEOUT, POLL), f"timed out waiting for {what}"

    async def stop(self) -> None:
        """Cancel whatever still runs (the validator serves blobs forever) and leave the network."""
        for future in self.running:
            future.cancel()
        for future in self.running:
            with contextlib.suppress(asyncio.CancelledError):
                await future
        await self.network.shutdown()


def adaptive_manifest() -> Manifest:
    return Manifest.model_validate(
        {
            "name": "adaptive",
            "validators": [key("validator").public_hex],
            "model": {"gpt": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32}},
            "data": {"batch_size": 4, "seq_len": 32},
            "train": {"inner_steps": 2, "inner": {"lr": 3e-3}, "codec": "pulseloco", "overlap": False},
            "round": {
                "deadline_seconds": 30.0,
                "checkpoint_every": 10,
                "deadline_mode": "adaptive",
                "quorum": 0.6,
                "min_seconds": 1.0,  # a floor on the target, as a run sets one: room for a shrunk payload
                "margin_mads": 3.0,
            },
            "selection": {**SELECTION, "held_out_batches": 0},
        }
    )


def two_validators_manifest() -> Manifest:
    """Validators a and b (in that order) of a tiny GPT run: standbys take over after 8 s."""
    return Manifest.model_validate(
        {
            "name": "two-validators",
            "validators": [key("validator-a").public_hex, key("validator-b").public_hex],
            "model": {"gpt": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32}},
            "data": {"batch_size": 4, "seq_len": 32},
            "train": {"inner_steps": 2, "inner": {"lr": 3e-3}, "overlap": False},
            "round": {"deadline_seconds": 8.0, "checkpoint_every": 2, "takeover_seconds": 8.0},
            "selection": {**SELECTION, "held_out_batches": 1},
        }
    )


MakeHarness = Callable[[str, Manifest], Harness]
"""The `round_harness` fixture (`conftest.py`): a `Harness` for a manifest, in a new folder named after the name."""
