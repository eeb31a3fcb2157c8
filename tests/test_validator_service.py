"""The validator service's intake decisions, in process (no network)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from node.events import Events
from node.net.memory import MemoryNetwork
from node.roles.hooks import HeldOut
from node.roles.records import run_records
from node.roles.tasks import validator_for
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.codec import default_max_bytes
from protocol.identity import Identity
from protocol.messages import SubmissionHeader


def _header(setup: RunSetup, size: int, sender: str) -> SubmissionHeader:
    h = hashlib.sha256(b"x").hexdigest()
    return SubmissionHeader(
        run_id=setup.run_id,
        round=0,
        base_state_hash=h,
        payload_sha256=h,
        payload_size=size,
        codec="sparseloco",
        data_digest=h,
        sender=sender,
    )


def test_an_oversize_payload_is_refused_from_its_header(tmp_path: Path) -> None:
    me = Identity.generate()
    setup = RunSetup.from_manifest(Manifest.model_validate({"name": "t", "validators": [me.public_hex]}))
    peer = MemoryNetwork(run_records(setup.manifest)).join(me, tmp_path, role="validator")
    service = validator_for(setup, task_for(setup), me, tmp_path, peer, Events("validator"))
    service.closed = False
    cap = default_max_bytes(service.validator.weights)
    miner = Identity.generate().public_hex
    assert service._accept(_header(setup, cap, miner)) is None
    reason = service._accept(_header(setup, cap + 1, miner))
    assert reason is not None and reason.startswith("oversize")


def test_round_metrics_carry_the_loss_bytes_and_standings_within_bounds(tmp_path: Path) -> None:
    me = Identity.generate()
    setup = RunSetup.from_manifest(Manifest.model_validate({"name": "t", "validators": [me.public_hex]}))
    peer = MemoryNetwork(run_records(setup.manifest)).join(me, tmp_path, role="validator")
    service = validator_for(setup, task_for(setup), me, tmp_path, peer, Events("validator"))
    report = service.validator.run_round([])
    metrics = service._metrics(report, 0, 0, HeldOut(loss=3.5))
    assert (metrics.round, metrics.held_out_loss, metrics.submissions, metrics.standings) == (0, 3.5, 0, ())
    assert metrics.run_id == setup.run_id and metrics.received_bytes == metrics.dense_bytes == 0
    diverged = service._metrics(report, 0, 0, HeldOut(loss=float("nan"), reward=float("inf")))
    assert diverged.held_out_loss is None and diverged.held_out_reward is None  # left out
