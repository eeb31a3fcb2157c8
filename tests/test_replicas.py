"""Replicas of a round's blobs pushed to a standby validator (`node/roles/replicas.py`) on the in-memory
network: the active validator's is taken; a push signed by the wrong key, one whose blobs do not hash to
what its result names, and an oversize one are refused with their reason, leaving the standby's store
as it was."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from node.net.dht import sign_for
from node.net.memory import MemoryNetwork, MemoryPeer
from node.roles.records import run_records
from node.roles.replicas import ReplicaTaker
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.codec import default_max_bytes
from protocol.errors import TransferError
from protocol.identity import Identity
from tests.rounds import (
    key,
    two_validators_manifest,
)
from validator.audit import Replica
from validator.core import RoundReport, Validator, initial_snapshot

WAIT = 30.0


class Standby:
    """Validator b standing by at W_0, validator a active; a third key, mallory, is no validator."""

    def __init__(self, root: Path) -> None:
        self.setup = RunSetup.from_manifest(two_validators_manifest())
        task = task_for(self.setup)
        cfg, run_id = self.setup.manifest.gauntlet(), self.setup.run_id
        self.a, self.b, self.mallory = key("validator-a"), key("validator-b"), key("mallory")
        self.replica = Replica.from_snapshot(initial_snapshot(cfg, task.initial_master()), cfg)

        def closed(who: Identity, name: str) -> RoundReport:
            made = Validator.create(
                root / name, cfg, run_id, who, task.initial_master(), task.evaluator(), task.batch_fn()
            )
            return made.run_round([])

        self.report, self.forged = closed(self.a, "a"), closed(self.mallory, "mallory")
        self.network = MemoryNetwork(run_records(self.setup.manifest))
        self.pa = self.network.join(self.a, root / "pa", role="validator")
        self.pb = self.network.join(self.b, root / "pb", role="validator")
        taker = ReplicaTaker(self.setup, self.pb, self.b.public_hex, lambda: self.replica, lambda: self.a.public_hex)
        self.pb.take_replicas(taker.on_replica)

    def serve(self, peer: MemoryPeer, report: RoundReport) -> None:
        peer.store.put(report.patch)
        peer.store.put(report.evidence)

    async def push(self, envelope: bytes) -> None:
        await self.pa.replicate(envelope, to=self.pb.peer_id, wait=WAIT)


def test_the_standby_takes_the_active_validators_replica(tmp_path: Path) -> None:
    s = Standby(tmp_path)
    s.serve(s.pa, s.report)
    result = s.report.result

    async def main() -> None:
        await s.push(s.report.envelope)
        await s.network.shutdown()

    asyncio.run(main())
    assert s.pb.store.has(result.patch_sha256) and s.pb.store.has(result.evidence.sha256)
    assert {result.patch_sha256, result.evidence.sha256} <= set(s.pb.held)  # it serves them: a holder


@pytest.mark.parametrize("hostile", ["wrong key", "wrong hashes", "missing blob", "oversize", "not a result"])
def test_a_hostile_replica_is_refused_with_its_reason_and_changes_nothing(
    tmp_path: Path, hostile: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = Standby(tmp_path)
    result = s.report.result
    envelope = s.report.envelope
    if hostile == "wrong key":  # a well-formed result, signed by a key that is not the active validator
        s.serve(s.pa, s.forged)
        envelope, expect = s.forged.envelope, "not one of the run's validators"
    elif hostile == "wrong hashes":  # the pushing peer serves other bytes under the patch's hash
        s.serve(s.pa, s.report)
        s.pa.store.path(result.patch_sha256).write_bytes(b"\x00" * result.patch_size)
        expect = "could not be had"
    elif hostile == "missing blob":  # it names a patch it cannot serve: the evidence fetched is dropped
        s.pa.store.put(s.report.evidence)
        expect = "could not be had"
    elif hostile == "oversize":  # a signed result naming a patch larger than any patch of these weights
        s.serve(s.pa, s.report)
        big = result.model_copy(update={"patch_size": default_max_bytes(s.replica.weights) + 1})
        envelope, expect = sign_for(s.a, big, 3600).to_bytes(), "oversize patch"
    else:
        envelope, expect = b"\x01" * 100, "not a signed round result"
    before = sorted(s.pb.store)

    async def main() -> None:
        with pytest.raises(TransferError, match=expect):
            await s.push(envelope)
        await s.network.shutdown()

    with caplog.at_level(logging.INFO, logger="node.net.transfer"):
        asyncio.run(main())
    assert sorted(s.pb.store) == before and not s.pb.held  # nothing stored, nothing announced
    assert any("replica from" in r.message and "REJECTED" in r.message for r in caplog.records)


def test_a_node_that_is_no_standby_refuses_replicas(tmp_path: Path) -> None:
    s = Standby(tmp_path)
    s.serve(s.pa, s.report)
    s.pb.take_replicas(None)

    async def main() -> None:
        with pytest.raises(TransferError, match="takes no replicas"):
            await s.push(s.report.envelope)
        await s.network.shutdown()

    asyncio.run(main())
    assert not s.pb.store.has(s.report.result.patch_sha256)
