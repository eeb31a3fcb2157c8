"""A miner's receipt (`validator/receipt.py`): the verdict from the signed result and its evidence,
and the miner's gains recomputed from W_r, its payload and the revealed round secret.

One round of three honest fake miners and one free rider (an all-zero update), from W_0.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from node.bench.arena import Arena
from node.swarm.fakeminers import identity_for
from protocol.messages import RoundResult
from protocol.signing import open_signed
from tests.fakeswarm import Swarm, make_swarm
from validator.audit import Replica
from validator.core import RoundReport, initial_snapshot
from validator.evidence import RoundEvidence
from validator.intake import Submission
from validator.receipt import Receipt, Recomputed, explain, recompute


@dataclasses.dataclass
class Played:
    swarm: Swarm
    report: RoundReport
    submissions: list[Submission]


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Played:
    swarm = make_swarm(min_indicator_average=0.0)
    arena = Arena(swarm.validator(tmp_path_factory.mktemp("receipt")), swarm.honest(3))
    submissions, _, _ = arena.submissions()
    return Played(swarm, arena.validator.run_round(submissions), submissions)


def _result(played: Played) -> RoundResult:
    return open_signed(played.report.envelope, run_id=played.swarm.setup.spec.run_id, expect=RoundResult).message


def _payload(played: Played, sha: str | None) -> bytes:
    return next(s.payload for s in played.submissions if hashlib.sha256(s.payload).hexdigest() == sha)


def _recompute(played: Played, miner: str, payload: bytes | None = None) -> tuple[Receipt, Recomputed]:
    result, evidence = _result(played), RoundEvidence.from_bytes(played.report.evidence)
    receipt = explain(result, evidence, miner)
    w0 = Replica.from_snapshot(initial_snapshot(played.swarm.cfg, played.swarm.init), played.swarm.cfg).weights
    s = played.swarm
    data = payload if payload is not None else _payload(played, receipt.payload_sha256)
    key = identity_for("validator").public_key
    return receipt, recompute(receipt, evidence, key, w0, data, s.cfg, s.evaluator(), s.setup.batch)


def test_a_selected_miner_recomputes_its_gains_within_the_tolerance(played: Played) -> None:
    result = _result(played)
    assert result.selected
    for s in result.selected:
        receipt, again = _recompute(played, s.sender)
        assert receipt.verdict == "selected" and receipt.rank is not None and receipt.score == s.score
        assert again.ok, again.differs


def test_a_receipt_names_why_and_a_key_the_round_never_saw(played: Played) -> None:
    result = _result(played)
    evidence = RoundEvidence.from_bytes(played.report.evidence)
    for rej in result.rejections:
        assert explain(result, evidence, rej.sender).reason == rej.reason
    stranger = explain(result, evidence, "ab" * 32)
    assert stranger.verdict == "not named" and stranger.assessed is None


def test_another_payload_does_not_reproduce_the_committed_gains(played: Played) -> None:
    """Recomputing with someone else's update: the norm (exact) and the gains differ, and it says so."""
    result = _result(played)
    me, other = result.selected[0], result.selected[-1]
    assert me.payload_sha256 != other.payload_sha256
    _, again = _recompute(played, me.sender, _payload(played, other.payload_sha256))
    assert not again.ok and any(d.startswith("norm") for d in again.differs)


def test_a_forged_round_secret_is_refused(played: Played) -> None:
    result = _result(played)
    evidence = RoundEvidence.from_bytes(played.report.evidence)
    forged = evidence.model_copy(update={"secret": "00" * 64})
    receipt = explain(result, forged, result.selected[0].sender)
    s = played.swarm
    w0 = Replica.from_snapshot(initial_snapshot(s.cfg, s.init), s.cfg).weights
    with pytest.raises(Exception, match=r"[Ss]ignature"):
        recompute(receipt, forged, identity_for("validator").public_key, w0, b"", s.cfg, s.evaluator(), s.setup.batch)
