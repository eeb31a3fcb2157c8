"""`pulse doctor` in process: against a live run on the in-memory network whose links are rate-limited,
the probes measure those rates, the run's records give the round's figures, and the forecast and its
advice follow from them."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
import torch

from node.events.models import RoundClosed
from node.roles.doctor import measure, reachability
from node.roles.forecast import Forecast, forecast, join_seconds
from node.run.task import task_for
from protocol.identity import Identity
from tests.rounds import (
    Harness,
    adaptive_manifest,
)

VALIDATOR_UP = 3e6  # bytes/s
DOCTOR_UP = 0.5e6


async def diagnose(root: Path) -> Forecast:
    h = Harness(root, adaptive_manifest())
    h.rounds = 10_000  # the run stays live however long the measurements take (it is stopped after)
    try:
        h.start_validator()
        miner = h.start_miner("miner0")
        await h.until("round 1 closed", lambda log: log.has(RoundClosed, "validator", 1))
        h.network.uplink[h.network.peers[next(iter(h.network.peers))].peer_id] = VALIDATOR_UP
        peer = h.network.join(Identity.generate(), root / "doctor", role="follower")
        h.network.uplink[peer.peer_id] = DOCTOR_UP
        measured = await measure(
            h.setup,
            task_for(h.setup),
            peer,
            steps=2,
            probe_bytes=1 << 20,
            folder=root,
            reachability=reachability(["/ip4/192.168.1.20/tcp/4001"]),
        )
        miner.cancel()
        return forecast(measured, h.setup.manifest)
    finally:
        await h.stop()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Forecast:
    torch.set_num_threads(1)
    return asyncio.run(diagnose(tmp_path_factory.mktemp("doctor")))


def test_the_probes_measure_the_links(report: Forecast) -> None:
    m = report.measured
    assert m.down_bytes_per_second is not None and m.up_bytes_per_second is not None
    assert m.down_bytes_per_second == pytest.approx(VALIDATOR_UP, rel=0.15)
    assert m.up_bytes_per_second == pytest.approx(DOCTOR_UP, rel=0.15)


def test_the_run_is_read_from_its_records(report: Forecast) -> None:
    m = report.measured
    assert m.current_round >= 2 and not m.problems
    assert m.patch_bytes and m.run_payload_bytes and m.join_bytes
    assert m.round_seconds is not None and m.target_seconds > 0
    assert m.step_seconds > 0 and m.own_payload_bytes > 0 and m.params > 0


def test_the_forecast_follows_from_the_measurements(report: Forecast) -> None:
    m = report.measured
    assert report.upload_seconds == pytest.approx(report.bytes_up_per_round / DOCTOR_UP, rel=0.2)
    assert report.join_seconds is not None and report.join_seconds >= (m.join_bytes or 0) / VALIDATOR_UP * 0.8
    assert report.makes_target == ((report.submit_seconds or 0) <= m.target_seconds)
    assert (report.fraction < 1.0) == (report.makes_target is False)
    assert "private network only" in m.reachability
    assert report.to_json()["measured"]["params"] == m.params


def test_a_join_counts_its_lookups_and_each_patch_read(report: Forecast) -> None:
    """A join first finds where the run is and prices its plan, then reads each round's result
    before applying its patch: on a small state those reads are most of the time."""
    m = report.measured
    assert m.lookup_seconds > 0 and m.read_seconds > 0
    base = join_seconds(dataclasses.replace(m, lookup_seconds=0.0, read_seconds=0.0), 10**6, 3)
    with_reads = join_seconds(m, 10**6, 3)
    assert base is not None and with_reads == pytest.approx(base + m.lookup_seconds + 3 * m.read_seconds)
    assert report.join_seconds == pytest.approx(join_seconds(m, m.join_bytes or 0, m.join_patches))
    assert join_seconds(dataclasses.replace(m, down_bytes_per_second=None), 10**6, 3) is None


def test_reachability_from_addresses() -> None:
    assert reachability(["/ip4/8.8.8.8/tcp/1"]).startswith("direct")
    assert reachability(["/ip4/127.0.0.1/tcp/1"]).startswith("loopback")
    assert reachability(["/ip4/1.2.3.4/tcp/1/p2p/Qm/p2p-circuit"]).startswith("through a relay")
