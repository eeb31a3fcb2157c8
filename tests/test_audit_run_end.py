"""`pulse audit` at the end of a run, on the in-memory network: the validator leaves with the last
round's inputs, and the auditor stops in one line instead of retrying that round forever."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from node.events.audit import Audited
from node.events.models import Final
from node.roles.auditor import Auditor
from tests.rounds import POLL, Harness, key, lm_manifest

ROUNDS = 3


def test_an_auditor_stops_when_the_run_ended_without_the_last_rounds_inputs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(tmp_path, lm_manifest())
    h.rounds = ROUNDS

    async def main() -> None:
        h.start_validator()
        h.start_miner("miner0")
        await h.until("the run's end", lambda log: log.has(Final, "miner0"))
        validator = next(p for p in h.network.peers.values() if p.identity.public_hex == key("validator").public_hex)
        last = await validator.round_result(ROUNDS - 1)
        assert last is not None
        validator.store.remove(last.evidence.sha256)  # what left with the validator: the last round's evidence
        peer = h.network.join(key("auditor"), tmp_path / "auditor", role="follower")
        auditor = Auditor(h.setup, peer, h.events("auditor", "audit"), tmp_path / "auditor", h.task.initial_master,
                          poll=POLL, give_up_seconds=1.0)  # fmt: skip
        with caplog.at_level(logging.WARNING):
            held = await asyncio.wait_for(auditor.run(ROUNDS), 60)
        assert held.round == ROUNDS - 1
        await h.stop()

    asyncio.run(main())
    assert [e.round for e in h.log().events(Audited, "auditor")] == list(range(ROUNDS - 1))
    ended = [r.getMessage() for r in caplog.records if "the run has ended" in r.getMessage()]
    assert len(ended) == 1 and f"round {ROUNDS - 1}:" in ended[0], ended
