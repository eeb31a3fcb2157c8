"""Prometheus metrics: each event kind moves the metrics it names, label sets stay bounded whatever
peers send, and a role's endpoint serves them (with what the network counts) on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import string
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from node.events import Events
from node.events.metrics import REASON_CLASSES, EventMetrics, reason_class
from node.events.models import (
    Baseline,
    CheckpointLoaded,
    Done,
    Missed,
    PatchApplied,
    Received,
    RolloutsPublished,
    RoundClosed,
    RoundOpened,
    Scored,
    Started,
    Submitted,
)
from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.roles.metrics import NodeMetrics
from protocol.errors import TransferError
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.signing import sign
from tests.helpers import scrape

H1, H2, H3 = "a1" * 32, "b2" * 32, "c3" * 32
RUN = hashlib.sha256(b"pulse-test-metrics").hexdigest()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fresh() -> tuple[EventMetrics, CollectorRegistry, Clock]:
    registry, clock = CollectorRegistry(), Clock()
    return EventMetrics(registry, clock), registry, clock


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def closed(round_: int, rejections: dict[str, str], **changes: object) -> RoundClosed:
    fields: dict[str, object] = dict(
        round=round_, submissions=3, selected=1, bytes=3000, dense_bytes=30_000, patch_bytes=5000,
        state_bytes=15_000, loss=4.5, changed_fraction=0.01, scores={H1: 0.2}, rejections=rejections,
        state_hash=H3, seconds=1.5, decide_seconds=1.0, encode_seconds=0.05, held_out_seconds=0.2,
    )  # fmt: skip
    fields.update(changes)
    return RoundClosed(**fields)  # type: ignore[arg-type]


def test_a_follower_catching_up_reports_round_state_age_and_bytes() -> None:
    m, registry, clock = fresh()
    for unknown in ("pulse_state_age_seconds", "pulse_round", "pulse_miner_last_place"):  # holds nothing yet
        assert math.isnan(value(registry, unknown) or 0.0), unknown
    m.record(CheckpointLoaded(round=3, state_hash=H1, bytes=40_000, behind=2))
    assert value(registry, "pulse_round") == 3 and value(registry, "pulse_catchup_patches_remaining") == 2
    clock.now += 7.0
    assert value(registry, "pulse_state_age_seconds") == 7.0
    m.record(PatchApplied(round=3, patch_bytes=900, state_hash=H2, seconds=0.02))
    m.record(PatchApplied(round=4, patch_bytes=1100, state_hash=H3, seconds=0.03))
    assert value(registry, "pulse_round") == 5 and value(registry, "pulse_catchup_patches_remaining") == 0
    assert value(registry, "pulse_state_age_seconds") == 0.0  # the state just changed
    assert value(registry, "pulse_received_bytes_total", kind="checkpoint") == 40_000
    assert value(registry, "pulse_received_bytes_total", kind="patch") == 2000
    assert value(registry, "pulse_received_bytes_total", kind="submission") == 0  # every kind from the start
    assert value(registry, "pulse_patch_bytes_count") == 2 and value(registry, "pulse_patch_bytes_sum") == 2000
    assert value(registry, "pulse_codec_seconds_count", op="patch_apply") == 2
    assert value(registry, "pulse_patches_applied_total") == 2
    assert value(registry, "pulse_checkpoints_loaded_total") == 1
    clock.now += 3.0
    m.record(Done(round=5, state_hash=H3))  # the same state: its age keeps growing
    assert value(registry, "pulse_state_age_seconds") == 3.0


def test_a_miner_reports_its_submissions_scores_places_and_step_time() -> None:
    m, registry, _ = fresh()
    m.record(Submitted(round=0, bytes=2500, loss=5.1, busy_fraction=0.8, compress_seconds=0.04, step_seconds=0.3))
    m.record(Scored(round=0, of=3, place=2, score=0.25))
    assert value(registry, "pulse_submissions_sent_total") == 1
    assert value(registry, "pulse_sent_bytes_total", kind="submission") == 2500
    assert value(registry, "pulse_payload_bytes_sum") == 2500 and value(registry, "pulse_payload_bytes_count") == 1
    assert (value(registry, "pulse_miner_last_place"), value(registry, "pulse_miner_last_score")) == (2, 0.25)
    assert value(registry, "pulse_train_loss") == 5.1 and value(registry, "pulse_miner_busy_ratio") == 0.8
    assert value(registry, "pulse_inner_step_seconds_sum") == 0.3
    assert value(registry, "pulse_codec_seconds_count", op="compress") == 1
    m.record(Scored(round=1, of=3, reason="behind: trained from the state of round 0, 1 rounds old"))
    m.record(Scored(round=2, of=3))  # recorded as missing
    m.record(Missed(round=3, reason="the validator's peer id is unknown"))
    assert value(registry, "pulse_miner_last_place") == 0 and value(registry, "pulse_miner_last_scored_round") == 2
    assert value(registry, "pulse_miner_outcomes_total", outcome="aggregated") == 1
    assert value(registry, "pulse_miner_outcomes_total", outcome="rejected") == 1
    assert value(registry, "pulse_miner_outcomes_total", outcome="missing") == 1
    assert value(registry, "pulse_miner_rejected_total", reason="behind") == 1
    assert value(registry, "pulse_missed_total") == 1


def test_a_rollout_worker_counts_its_batches_and_those_a_validator_took_by_push() -> None:
    m, registry, _ = fresh()
    m.record(RolloutsPublished(round=0, completions=64, bytes=2000, mean_reward=0.5, pushed=True))
    m.record(RolloutsPublished(round=1, completions=64, bytes=2000, mean_reward=0.5))  # announced only
    assert value(registry, "pulse_rollouts_published_total") == 2
    assert value(registry, "pulse_rollouts_pushed_total") == 1


def test_the_validator_reports_submissions_rejections_by_class_and_timings() -> None:
    m, registry, _ = fresh()
    m.record(Started(sender=H1, round=4, peer_id="Qm" + "1" * 44))
    assert value(registry, "pulse_round") == 4
    m.record(Baseline(loss=6.0))
    m.record(RoundOpened(round=4, state_hash=H2))
    for sender in (H1, H2, H3):
        m.record(Received(round=4, sender=sender, bytes=1000))
    rejections = {H2: "undecodable: NonFiniteValues: payload holds NaN", H3: "free rider: norm 0 <= 0.1 x the median 2"}
    m.record(closed(4, rejections, ignored=["stale round 3, this is round 4"]))
    assert value(registry, "pulse_submissions_received_total") == 3
    assert value(registry, "pulse_submissions_selected_total") == 1
    assert value(registry, "pulse_received_bytes_total", kind="submission") == 3000
    for reason in ("undecodable", "free_rider", "round"):
        assert value(registry, "pulse_submissions_rejected_total", reason=reason) == 1
    assert value(registry, "pulse_held_out_loss") == 4.5
    assert value(registry, "pulse_evaluation_seconds_sum", what="submissions") == 1.0
    assert value(registry, "pulse_evaluation_seconds_sum", what="held_out") == 0.2
    assert value(registry, "pulse_codec_seconds_sum", op="patch_encode") == 0.05
    assert value(registry, "pulse_validator_round_seconds_count") == 1
    assert value(registry, "pulse_patch_bytes_sum") == 5000


def test_a_flood_of_fresh_keys_and_crafted_reasons_does_not_grow_any_label_set() -> None:
    m, registry, _ = fresh()
    rng = random.Random(7)
    for r in range(50):
        crafted = {
            Identity.generate().public_hex: "".join(rng.choices(string.printable, k=rng.randint(0, 100)))
            for _ in range(40)
        }
        m.record(closed(r, crafted, ignored=[f"{Identity.generate().public_hex}: {r}"]))
        m.record(Scored(round=r, of=40, reason=rng.choice(list(crafted.values()))))
    for family in registry.collect():
        for sample in family.samples:
            assert set(sample.labels) <= {"reason", "kind", "op", "what", "outcome", "le"}, sample
            if "reason" in sample.labels:
                assert sample.labels["reason"] in REASON_CLASSES
    rejected = [s for f in registry.collect() if f.name == "pulse_submissions_rejected" for s in f.samples]
    assert len({s.labels["reason"] for s in rejected}) <= len(REASON_CLASSES)
    assert sum(s.value for s in rejected if s.name.endswith("_total")) == 50 * 41  # every one counted


def test_reason_classes_of_peer_text() -> None:
    assert reason_class(None) == reason_class("") == reason_class("anything a peer wrote") == "other"
    assert reason_class("InvalidSignature: the signature does not verify") == "envelope"
    assert reason_class("final score 0.0123 ranks 9, top 8 aggregated") == "rank"
    assert reason_class("copy of 0123456789abcdef's submission") == "copy"


def test_events_feed_their_sinks() -> None:
    m, registry, _ = fresh()
    seen: list[object] = []
    events = Events("miner", sinks=[m.record])
    events.add_sink(seen.append)
    events.emit(Submitted(round=0, bytes=10, loss=1.0, busy_fraction=0.5), "submitted")
    assert value(registry, "pulse_submissions_sent_total") == 1 and len(seen) == 1


def test_a_role_endpoint_serves_event_network_and_process_metrics_on_loopback(tmp_path: Path) -> None:
    validator_key = Identity.generate()
    net = MemoryNetwork(RunRecords(RUN, (validator_key.public_hex,), 3600.0, 5))
    holder = net.join(validator_key, tmp_path / "validator", role="validator")
    reader = net.join(Identity.generate(), tmp_path / "reader", role="follower")
    metrics = NodeMetrics.serve(0, "127.0.0.1", role="validator", run_id=RUN, key=validator_key.public_hex)
    try:
        metrics.watch(holder)
        assert metrics.events is not None
        Events("validator", sinks=[metrics.events.record]).emit(RoundOpened(round=2, state_hash=H1), "open")
        data = b"pulse patch" * 300
        sha = holder.store.put(data)
        holder.hold(sha, 2)
        payload = b"payload" * 10
        header = SubmissionHeader.for_payload(
            run_id=RUN, round_=2, base_hash=H1, payload=payload, codec="dense", data_digest="0" * 64,
            sender=reader.identity.public_hex,
        )  # fmt: skip

        async def main() -> None:
            await holder.heartbeat(2, H1)
            await reader.fetch(sha, len(data), 2)
            assert await reader.validator_heartbeat(2) is not None
            with pytest.raises(TransferError):  # this node takes no submissions yet: refused at the stream
                await reader.submit(sign(reader.identity, header), reader.store.path(reader.store.put(payload)))

        asyncio.run(main())
        assert metrics.url.startswith("http://127.0.0.1:") and metrics.url.endswith("/metrics")
        samples = scrape(metrics.url)
    finally:
        metrics.close()
        asyncio.run(net.shutdown())
    info = [labels for name, labels in samples if name == "pulse_node_info"]
    assert info == [(("key", validator_key.public_hex), ("role", "validator"), ("run_id", RUN))]
    assert samples[("pulse_round", ())] == 2
    assert samples[("pulse_served_bytes_total", ())] == len(data)
    assert samples[("pulse_submissions_refused_total", (("status", "rejected"),))] == 1
    assert samples[("pulse_submissions_refused_total", (("status", "busy"),))] == 0
    assert samples[("pulse_peers", ())] == 1  # the other peer on the in-memory network
    assert samples[("process_resident_memory_bytes", ())] > 0
    assert samples[("pulse_peak_resident_memory_bytes", ())] > 0
    with pytest.raises(OSError):  # the server is gone
        urllib.request.urlopen(metrics.url, timeout=2)
