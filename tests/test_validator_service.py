"""The validator service's intake decisions, in process (no network)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

from node.events import Events
from node.net.dht import sign_for
from node.net.memory import MemoryNetwork, memory_peer_id
from node.roles.hooks import HeldOut
from node.roles.intake import RoundIntake, terms_of
from node.roles.records import run_records
from node.roles.summary import Figures, round_metrics
from node.roles.tasks import validator_for
from node.roles.validator_service import ValidatorService, senders_to_wait_for
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.assignment import Assignment
from protocol.codec import default_max_bytes
from protocol.identity import Identity
from protocol.messages import Heartbeat, SubmissionHeader
from validator.gauntlet import Outcome


def _header(setup: RunSetup, service: ValidatorService, size: int, sender: str, **claims: str) -> SubmissionHeader:
    """A header for the open round that passes every check but its size (and the `claims` it overrides)."""
    batches = setup.manifest.selection.assignment_batches
    fields = {
        "run_id": setup.run_id,
        "round": service.round,
        "base_state_hash": service.validator.state_hash,
        "payload_sha256": hashlib.sha256(b"x").hexdigest(),
        "payload_size": size,
        "codec": setup.manifest.train.codec,
        "data_digest": Assignment(setup.run_id, service.round, sender, batches).digest,
        "sender": sender,
    }
    return SubmissionHeader.model_validate(fields | claims)


def _service(tmp_path: Path) -> tuple[RunSetup, ValidatorService]:
    me = Identity.generate()
    setup = RunSetup.from_manifest(Manifest.model_validate({"name": "t", "validators": [me.public_hex]}))
    events = Events("validator")
    intake = RoundIntake(setup, events, tmp_path / "inbox")
    peer = MemoryNetwork(run_records(setup.manifest)).join(me, tmp_path, role="validator", intake=intake)
    return setup, validator_for(setup, task_for(setup), me, tmp_path, peer, events, intake)


def _open(service: ValidatorService) -> None:
    v = service.validator
    service.intake.open(terms_of(service.setup, service.identity, v.book, v.state_hash, v.weights))


def test_an_oversize_payload_is_refused_from_its_header(tmp_path: Path) -> None:
    setup, service = _service(tmp_path)
    _open(service)
    cap = default_max_bytes(service.validator.weights)
    miner = Identity.generate().public_hex
    assert service.intake.accept(_header(setup, service, cap, miner)) is None
    reason = service.intake.accept(_header(setup, service, cap + 1, miner))
    assert reason is not None and reason.startswith("oversize")


def test_a_seated_body_is_wanted_until_its_round_closes(tmp_path: Path) -> None:
    """What the transfer service asks while a body arrives (`void`): a reason once the round closed."""
    setup, service = _service(tmp_path)
    _open(service)
    header = _header(setup, service, 100, Identity.generate().public_hex)
    assert service.intake.accept(header) is None and service.intake.void(header) is None
    service.intake.close()
    assert service.intake.void(header) == f"round {service.round} closed while its body arrived"


def test_base_state_codec_and_data_digest_are_refused_from_the_header(tmp_path: Path) -> None:
    """Checked before any body byte is read, with the Gauntlet's own reasons (`check_header`)."""
    setup, service = _service(tmp_path)
    _open(service)
    miner, other = Identity.generate().public_hex, Identity.generate().public_hex
    wrong = {
        "base_state_hash": ("0" * 64, "unknown base state"),
        "codec": ("dense", "codec dense"),
        "data_digest": (Assignment(setup.run_id, 0, other, 1).digest, "data digest does not match"),
    }
    for field_name, (value, reason) in wrong.items():
        refusal = service.intake.accept(_header(setup, service, 100, miner, **{field_name: value}))
        assert refusal is not None and refusal.startswith(reason), (field_name, refusal)
    assert service.intake.admission.offered == 0  # refused before admission: no seat, no bytes reserved


def test_a_flood_of_announced_newcomers_neither_moves_the_quorum_nor_fills_the_wait(tmp_path: Path) -> None:
    """Heartbeats are open records: 300 fresh keys announcing themselves as miners of the round are
    waited for only as newcomers, as many as seats, and the quorum counts the miners the round knows."""
    setup, service = _service(tmp_path)
    _open(service)
    network = service.peer.network  # type: ignore[attr-defined]
    senders = {Identity.generate().public_hex for _ in range(3)}
    service.previous_senders = senders
    for _ in range(300):
        me = Identity.generate()
        beat = Heartbeat(
            run_id=setup.run_id, round=service.round, role="miner", peer_id=memory_peer_id(me, 1),
            state_hash=None, blobs=(), sent_at=int(time.time()),
        )  # fmt: skip
        network.store(sign_for(me, beat, 600))
    assert len(network.get(Heartbeat, service.round)) >= 200
    known, newcomers = asyncio.run(service.awaited())
    assert known == senders
    assert 0 < len(newcomers) <= service.intake.rules.capacity and not newcomers & senders


def test_round_metrics_carry_the_loss_bytes_and_standings_within_bounds(tmp_path: Path) -> None:
    me = Identity.generate()
    setup = RunSetup.from_manifest(Manifest.model_validate({"name": "t", "validators": [me.public_hex]}))
    events = Events("validator")
    intake = RoundIntake(setup, events, tmp_path / "inbox")
    peer = MemoryNetwork(run_records(setup.manifest)).join(me, tmp_path, role="validator", intake=intake)
    service = validator_for(setup, task_for(setup), me, tmp_path, peer, events, intake)
    report = service.validator.run_round([])
    metrics = round_metrics(setup, service.validator, report, Figures(0, 0, setup.dense_bytes(), HeldOut(loss=3.5)))
    assert (metrics.round, metrics.held_out_loss, metrics.submissions, metrics.standings) == (0, 3.5, 0, ())
    assert metrics.run_id == setup.run_id and metrics.received_bytes == metrics.dense_bytes == 0
    diverged_loss = HeldOut(loss=float("nan"), reward=float("inf"))
    diverged = round_metrics(setup, service.validator, report, Figures(0, 0, setup.dense_bytes(), diverged_loss))
    assert diverged.held_out_loss is None and diverged.held_out_reward is None  # left out


def test_the_next_round_waits_only_for_senders_it_aggregated() -> None:
    """A flood of fresh keys that sent junk, updates refused before evaluation, or a random direction
    at the median norm (evaluated; its one-round indicator is +1 about half the time), must not hold
    the next round open to its deadline, waiting for keys that never send again: none of it costs
    work. An honest miner that was not aggregated is waited for only as established or as a
    newcomer that announced itself (`deadline.py`)."""
    outcomes = [
        Outcome(0, "selected", sender="aggregated", score=0.02),
        Outcome(1, "rejected", "record too short", sender="young", score=0.01, indicator=1),
        Outcome(2, "rejected", "indicator -1", sender="unlucky", score=-0.01, indicator=-1),
        Outcome(7, "rejected", "final score -0.2 is not positive", sender="random", score=-0.003, indicator=-1),
        Outcome(9, "rejected", "indicator average 0.05, this round +1", sender="lucky", score=0.0001, indicator=1),
        Outcome(8, "selected", sender="alone", score=0.01, indicator=-1),  # a lone update: aggregated all the same
        Outcome(3, "rejected", "undecodable", sender="junk"),
        Outcome(4, "rejected", "copy of the public previous step: cosine 0.990 on its positions", sender="slice"),
        Outcome(5, "rejected", "norm 3.1 is 151x the median 0.0205", sender="scaled"),
        Outcome(6, "ignored", "one submission per miner per round"),
    ]
    assert senders_to_wait_for(outcomes) == {"aggregated", "alone"}
