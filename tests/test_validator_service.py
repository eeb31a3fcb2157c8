"""The validator service's intake decisions, in process (no network)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from node.events import Events
from node.roles.validator_service import ValidatorService
from node.run.manifest import Manifest
from node.run.setup import RunSetup
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
    service = ValidatorService(setup, me, tmp_path, Events("validator"))
    service.closed = False
    cap = default_max_bytes(service.validator.weights)
    miner = Identity.generate().public_hex
    assert service._accept(_header(setup, cap, miner)) is None
    reason = service._accept(_header(setup, cap + 1, miner))
    assert reason is not None and reason.startswith("oversize")


def test_round_metrics_carry_the_loss_bytes_and_standings_within_bounds(tmp_path: Path) -> None:
    me = Identity.generate()
    setup = RunSetup.from_manifest(Manifest.model_validate({"name": "t", "validators": [me.public_hex]}))
    service = ValidatorService(setup, me, tmp_path, Events("validator"))
    report = service.validator.run_round([])
    metrics = service._metrics(report, [], 3.5, None)
    assert (metrics.round, metrics.held_out_loss, metrics.submissions, metrics.standings) == (0, 3.5, 0, ())
    assert metrics.run_id == setup.run_id and metrics.received_bytes == metrics.dense_bytes == 0
    assert service._metrics(report, [], float("nan"), float("inf")).held_out_loss is None  # diverged: left out
