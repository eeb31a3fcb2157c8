"""Auditing rounds from public data (`validator/audit.py`): an honest validator's rounds recompute to
the same bytes; each lie of the lying validator (`tests/redteam/pulse_redteam/lying.py`) is found.

One honest run of three rounds with fake miners; each lie replays its round 1 from the honest
state of round 1 with the same signed submissions, so the only difference is the lie.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_tensors

from node.bench.arena import Arena
from node.swarm.fakeminers import identity_for
from protocol.messages import RoundResult, SubmissionHeader
from protocol.signing import open_signed, sign
from pulse_redteam.lying import LIES, lying_validator
from tests.fakeswarm import Swarm, make_swarm
from validator.audit import AuditContext, AuditReport, Replica, _check_median, audit_round, refuted_rejection
from validator.core import RoundReport, initial_snapshot
from validator.evidence import Aggregated, Assessed, RoundEvidence
from validator.intake import Submission
from validator.state import StateStore

ROUNDS = 3


@dataclass
class Played:
    swarm: Swarm
    reports: list[RoundReport]
    submissions: list[list[Submission]]
    round1_state: Path  # a copy of the validator's folder holding the state of round 1

    def payloads(self, round_: int) -> dict[str, bytes]:
        return {_sha(s.payload): s.payload for s in self.submissions[round_]}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Played:
    root = tmp_path_factory.mktemp("audit")
    swarm = make_swarm(fp32_checkpoint_every=2, min_indicator_average=0.0)
    arena = Arena(swarm.validator(root / "honest"), swarm.honest(3))
    reports, subs = [], []
    for r in range(ROUNDS):
        submissions, _, _ = arena.submissions()
        reports.append(arena.validator.run_round(submissions))
        subs.append(submissions)
        if r == 0:
            shutil.copytree(root / "honest", root / "round1")
    return Played(swarm, reports, subs, root / "round1")


def context(swarm: Swarm) -> AuditContext:
    return AuditContext(swarm.setup.spec.run_id, (identity_for("validator").public_hex,), swarm.cfg)


def audit(replica: Replica, played: Played, report: RoundReport, round_: int, patch: bool = True) -> AuditReport:
    verified = open_signed(report.envelope, run_id=played.swarm.setup.spec.run_id, expect=RoundResult)
    payloads = played.payloads(round_)

    def payload(entry: Aggregated) -> bytes | None:
        return payloads.get(entry.payload_sha256)

    published = report.patch if patch else None
    return audit_round(replica, context(played.swarm), verified, report.evidence, payload, published)


def w0_replica(played: Played) -> Replica:
    return Replica.from_snapshot(initial_snapshot(played.swarm.cfg, played.swarm.init), played.swarm.cfg)


def test_an_honest_run_recomputes_to_the_same_states(played: Played) -> None:
    replica = w0_replica(played)
    for r, report in enumerate(played.reports):
        checked = audit(replica, played, report, r, patch=r != 1)  # round 1: the patch re-encoded, not fetched
        assert checked.ok, checked.findings
        assert checked.patch is not None and _sha(checked.patch) == report.result.patch_sha256
        assert replica.state_hash == report.state_hash and replica.fp32_hash == report.result.master_after
        assert replica.round == r + 1
    assert all(r.result.selected for r in played.reports)  # every round aggregated something


def test_the_evidence_lists_the_aggregation_and_reveals_the_secret(played: Played) -> None:
    report = played.reports[1]
    evidence = RoundEvidence.from_bytes(report.evidence)
    assert [(a.sender, a.payload_sha256) for a in evidence.aggregated] == [
        (s.sender, s.payload_sha256) for s in report.result.selected
    ]
    assert len(evidence.headers) == len(report.result.selected) + len(report.result.rejections)
    assert evidence.book.round == 2 and evidence.book.seen == [] and evidence.book.states[-1] == report.state_hash
    assert all(a.gains is not None for a in evidence.assessed)
    with pytest.raises(Exception, match="canonical"):
        RoundEvidence.from_bytes(report.evidence.replace(b'{"aggregated"', b'{ "aggregated"', 1))


def test_an_auditor_starts_from_a_signed_fp32_checkpoint(played: Played) -> None:
    report = played.reports[1]  # fp32_checkpoint_every=2: round 1's result names the state after it
    assert report.master_checkpoint is not None and report.result.master_checkpoint is not None
    evidence = RoundEvidence.from_bytes(report.evidence)
    replica = Replica.from_fp32(load_tensors(report.master_checkpoint), played.swarm.cfg, evidence.book)
    assert replica.fp32_hash == report.result.master_after and replica.state_hash == report.state_hash
    checked = audit(replica, played, played.reports[2], 2)
    assert checked.ok, checked.findings
    assert played.reports[0].result.master_checkpoint is None


@pytest.mark.parametrize("lie", LIES)
def test_every_lie_is_found(played: Played, lie: str, tmp_path: Path) -> None:
    folder = tmp_path / "liar"
    shutil.copytree(played.round1_state, folder)
    swarm = played.swarm
    liar = lying_validator(lie, from_round=1).open(
        folder, swarm.cfg, swarm.setup.spec.run_id, identity_for("validator"), swarm.evaluator(), swarm.setup.batch
    )
    lied = liar.run_round(played.submissions[1])
    honest = played.reports[1]
    assert [s.payload_sha256 for s in lied.result.selected] == [s.payload_sha256 for s in honest.result.selected]
    replica = Replica.from_snapshot(StateStore(played.round1_state).load(), swarm.cfg)
    checked = audit(replica, played, lied, 1)
    found = {f.what for f in checked.findings}
    if lie == "patch":
        assert lied.state_hash == honest.state_hash and found == {"patch"}
    elif lie == "median":  # the gate and the step were honest: only the committed median is not
        assert RoundEvidence.from_bytes(lied.evidence).median_norm > 0
        assert lied.state_hash == honest.state_hash and found == {"median"}
    else:
        assert lied.state_hash != honest.state_hash  # the lie moved the model, and the result says so
        assert {"step", "state"} <= found
    assert replica.round == 1  # the replica does not count the round as done


def test_a_rejection_its_header_refutes_is_found(played: Played) -> None:
    ctx = context(played.swarm)
    evidence = RoundEvidence.from_bytes(played.reports[1].evidence)
    header = open_signed(bytes.fromhex(evidence.headers[0]), run_id=ctx.run_id, expect=SubmissionHeader).message
    base = header.base_state_hash
    assert refuted_rejection(header, "behind: trained from the state of round 0, 1 rounds old", base, ctx, 10**9)
    assert refuted_rejection(header, "data digest does not match the miner's assignment", base, ctx, 10**9)
    assert refuted_rejection(header, "oversize: 5 bytes announced, cap is 4", base, ctx, 10**9) is not None
    assert refuted_rejection(header, "oversize: 5 bytes announced, cap is 4", base, ctx, 1) is None  # true: consistent
    assert refuted_rejection(header, "score -0.1: no gain on random data", base, ctx, 10**9) is None  # not decidable


def test_a_forged_or_missing_input_is_found(played: Played) -> None:
    report = played.reports[0]
    run_id = played.swarm.setup.spec.run_id
    # a result that names the honest evidence but is signed by another key: the secret is not the signer's
    forged = sign(identity_for("someone"), report.result).to_bytes()
    replica = w0_replica(played)
    verified = open_signed(forged, run_id=run_id, expect=RoundResult)
    checked = audit_round(replica, context(played.swarm), verified, report.evidence, lambda e: None, None)
    assert [f.what for f in checked.findings] == ["evidence"]
    # an aggregated payload nobody serves: the round cannot be checked (not a verdict on the validator)
    replica = w0_replica(played)
    verified = open_signed(report.envelope, run_id=run_id, expect=RoundResult)
    checked = audit_round(replica, context(played.swarm), verified, report.evidence, lambda e: None, None)
    assert {f.what for f in checked.findings} == {"payload"} and replica.round == 0
    # a payload that is not the one named
    checked = audit_round(replica, context(played.swarm), verified, report.evidence, lambda e: b"x", None)
    assert {f.what for f in checked.findings} == {"payload"}
    # a start that is not the replica's
    other = copy.copy(w0_replica(played))
    other.state_hash = "0" * 64
    checked = audit_round(other, context(played.swarm), verified, report.evidence, lambda e: None, None)
    assert "start" in {f.what for f in checked.findings}


def test_fp32_state_includes_momentum_only_when_it_is_on() -> None:
    from validator.outer import OuterConfig, OuterOptimizer

    master = {"w": torch.ones(3)}
    assert set(OuterOptimizer(OuterConfig(momentum=0.0), master).fp32_state()) == {"w"}
    assert set(OuterOptimizer(OuterConfig(momentum=0.9), master).fp32_state()) == {"w", "momentum/w"}


def test_a_cold_rounds_median_weights_are_checked(played: Played) -> None:
    """Round 0 has no established sender: each measured payload's committed `median_weight` (its gain
    on R) weighs it in the norm gate's median, and the auditor recomputes the median from them. A
    weight moved, one left out, or one given in a round with established senders is found."""
    evidence = RoundEvidence.from_bytes(played.reports[0].evidence)
    measured = [a for a in evidence.assessed if a.norm is not None]
    assert measured and all(a.median_weight is not None for a in measured)
    assert any(a.median_weight for a in measured)
    replica = w0_replica(played)

    def findings(assessed: list[Assessed], of: RoundEvidence = evidence, at: Replica = replica) -> set[str]:
        report = AuditReport(at.round)
        _check_median(played.swarm.cfg, at, of.model_copy(update={"assessed": tuple(assessed)}), report)
        return {f.what for f in report.findings}

    assert findings(list(evidence.assessed)) == set()
    by_norm = sorted(measured, key=lambda a: a.norm or 0.0)
    heavy = max(by_norm[0].median_weight or 0.0, 1.0) * 1e6  # the smallest norm now outweighs all
    moved = [a.model_copy(update={"median_weight": heavy}) if a is by_norm[0] else a for a in evidence.assessed]
    assert findings(moved) == {"median"}
    dropped = [a.model_copy(update={"median_weight": None}) if a is by_norm[0] else a for a in evidence.assessed]
    assert findings(dropped) == {"median"}
    at2 = w0_replica(played)
    for r in range(2):
        assert audit(at2, played, played.reports[r], r, patch=r != 1).ok
    later = RoundEvidence.from_bytes(played.reports[2].evidence)  # established senders by round 2
    assert findings(list(later.assessed), later, at2) == set()
    assert all(a.median_weight is None for a in later.assessed)
    given = [a.model_copy(update={"median_weight": 1.0}) for a in later.assessed]
    assert findings(given, later, at2) == {"median"}
