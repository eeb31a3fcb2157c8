"""`pulse follow --audit` against a lying validator, on the in-memory network: the auditing follower
reports the lie (an `audit_mismatch` naming what differs) and stays on the last verified state,
while a follower that only checks hashes applies the liar's patch.

A miner's receipt of round 0 (`pulse receipt`'s library call) is taken over the network too.

The validator is the real service with the lying `Validator` of `tests/redteam/pulse_redteam/lying.py` (honest in
round 0, adding an update of its own from round 1).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch

from node.events import EventLog, Events, read_events
from node.events.audit import Audited, AuditMismatch
from node.events.models import PatchApplied, RoundClosed
from node.net.memory import MemoryNetwork
from node.roles.intake import RoundIntake
from node.roles.receipt import Found, receipt_for
from node.roles.records import run_records
from node.roles.tasks import follower_for, miner_for, validator_for
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from pulse_redteam.lying import lying_validator
from tests.helpers import apoll
from tests.rounds import (
    SELECTION,
    key,
)

POLL = 0.05
ROUNDS = 3
RECEIPTS: dict[str, Found] = {}  # miner name -> its receipt of round 0, taken while the run is up


def manifest() -> Manifest:
    return Manifest.model_validate(
        {
            "name": "one-liar",
            "validators": [key("liar").public_hex],
            "model": {"gpt": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32}},
            "data": {"batch_size": 4, "seq_len": 32},
            "train": {"inner_steps": 2, "inner": {"lr": 3e-3}, "overlap": False},
            "round": {"deadline_seconds": 4.0, "checkpoint_every": 2},
            "selection": {**SELECTION, "held_out_batches": 1},
        }
    )


async def play(root: Path) -> EventLog:
    setup = RunSetup.from_manifest(manifest())
    task = task_for(setup)
    network = MemoryNetwork(run_records(setup.manifest))
    running: list[asyncio.Future[Any]] = []
    receipts = RECEIPTS

    def join(name: str, role: str) -> tuple[Any, Events]:
        peer = network.join(key(name), root / name, role=role)  # type: ignore[arg-type]
        return peer, Events(role, root / "events" / f"{name}.jsonl")

    events = Events("validator", root / "events" / "liar.jsonl")
    intake = RoundIntake(setup, events, root / "liar" / "inbox")
    peer = network.join(key("liar"), root / "liar", role="validator", intake=intake)
    lying = lying_validator("add", from_round=1)  # honest in round 0, lies from round 1
    liar = validator_for(
        setup, task, key("liar"), root / "liar", peer, events, intake, poll=POLL, validator_class=lying
    )
    running.append(asyncio.ensure_future(liar.run(ROUNDS)))
    for name in ("miner0", "miner1"):
        peer, events = join(name, "miner")
        running.append(asyncio.ensure_future(miner_for(setup, task, key(name), peer, events, poll=POLL).run(ROUNDS)))
    for name, audit in (("auditor", root / "auditor" / "audit"), ("follower", None)):
        peer, events = join(name, "follower")
        follower = follower_for(setup, task, key(name), peer, events, poll=POLL, audit=audit)
        running.append(asyncio.ensure_future(follower.run(ROUNDS)))
    try:
        done = await apoll(
            lambda: (
                read_events(root / "events").has(AuditMismatch, "auditor")
                and read_events(root / "events").has(PatchApplied, "follower", 2)
            ),
            120.0,
            POLL,
        )
        assert done, "timed out waiting for the mismatch and the follower's round 2"
        reader, _ = join("reader", "follower")
        for name in ("miner0", "miner1"):  # a miner's receipt of the honest round 0, over the network
            receipts[name] = await receipt_for(setup, task, reader, key(name).public_hex, 0)
    finally:
        for future in running:
            future.cancel()
        for future in running:
            with contextlib.suppress(asyncio.CancelledError):
                await future
        await network.shutdown()
    return read_events(root / "events")


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> EventLog:
    torch.set_num_threads(1)
    return asyncio.run(play(tmp_path_factory.mktemp("liar")))


def test_the_auditing_follower_reports_the_lie_and_stays_on_the_verified_state(played: EventLog) -> None:
    mismatches = played.events(AuditMismatch, "auditor")
    assert [m.round for m in mismatches] == [1]  # reported once
    assert any(f.startswith("state") or "fp32" in f.lower() for f in mismatches[0].findings), mismatches[0].findings
    assert [e.round for e in played.events(Audited, "auditor")] == [0]
    verified = played.events(Audited, "auditor")[0].state_hash
    lie = next(e for e in played.events(RoundClosed, "liar") if e.round == 1)
    assert lie.state_hash != verified


def test_a_hash_checking_follower_cannot_tell(played: EventLog) -> None:
    applied = {e.round: e.state_hash for e in played.events(PatchApplied, "follower")}
    lie = next(e for e in played.events(RoundClosed, "liar") if e.round == 1)
    assert applied[1] == lie.state_hash  # the liar's state, hash-checked and accepted


def test_a_miners_receipt_over_the_network_recomputes_its_gains(played: EventLog) -> None:
    closed = next(e for e in played.events(RoundClosed, "liar") if e.round == 0)
    keys = played.keys()
    for name, found in RECEIPTS.items():
        receipt = found.receipt
        assert receipt.round == 0 and receipt.miner == keys[name]
        assert receipt.verdict == ("selected" if keys[name] in closed.scores else "rejected")
        if receipt.verdict == "selected":  # its payload is kept fetchable: the gains are measured again
            assert found.recomputed is not None and found.recomputed.ok, found.recomputed
    assert any(f.recomputed is not None for f in RECEIPTS.values())
