"""Typed events: what a role writes is read back as the same model; a half-written last line is
skipped, anything else that is not an event is an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.events import Events, read_events
from node.events.campaign import AttackSent
from node.events.log import EventLogError, read_file
from node.events.models import Done, Final, PatchApplied, RoundClosed, Started

H = "ab" * 32


def closed(round_: int) -> RoundClosed:
    return RoundClosed(
        round=round_, submissions=2, selected=1, bytes=10, dense_bytes=1000, patch_bytes=20, state_bytes=500,
        loss=3.5, changed_fraction=0.1, scores={"cd" * 32: 0.25}, rejections={"ef" * 32: "copy"}, state_hash=H,
        seconds=0.5,
    )  # fmt: skip


def test_events_round_trip_as_readable_json_lines(tmp_path: Path) -> None:
    events = Events("validator", tmp_path / "validator.jsonl")
    events.emit(Started(sender="cd" * 32, round=0, peer_id="Qm" + "1" * 44), "start")
    events.emit(closed(0), "round 0")
    line = json.loads((tmp_path / "validator.jsonl").read_text().splitlines()[1])
    assert line["event"] == "round" and line["role"] == "validator" and line["scores"] == {"cd" * 32: 0.25}
    log = read_events(tmp_path)
    assert [r.event for r in log.of(RoundClosed)] == [closed(0)] and log.keys() == {"validator": "cd" * 32}
    assert all(r.name == "validator" and r.role == "validator" for r in log)


def test_a_half_written_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "miner0.jsonl"
    Events("miner", path).emit(PatchApplied(round=0, patch_bytes=9, state_hash=H), "patch")
    whole = path.read_text()
    path.write_text(whole + whole[:40])  # the writer is in the middle of its next line
    assert [type(r.event) for r in read_file(path)] == [PatchApplied]


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        json.dumps({"t": 1.0, "role": "miner", "event": "no-such-kind"}),
        json.dumps({"t": 1.0, "role": "miner", "event": "final", "round": "3", "state_hash": H}),  # a string round
        json.dumps({"t": 1.0, "role": "miner", "event": "final", "round": 3, "state_hash": H, "extra": 1}),
        json.dumps({"role": "miner", "event": "final", "round": 3, "state_hash": H}),  # no time
    ],
)
def test_a_line_that_is_not_an_event_is_an_error(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "miner0.jsonl"
    path.write_text(
        bad + "\n" + json.dumps({"t": 2.0, "role": "miner", "event": "done", "round": 1, "state_hash": H}) + "\n"
    )
    with pytest.raises(EventLogError):
        read_file(path)


def test_the_log_answers_typed_queries_across_processes(tmp_path: Path) -> None:
    Events("validator", tmp_path / "validator.jsonl").emit(Done(round=3, state_hash=H), "done")
    Events("follow", tmp_path / "follower.jsonl").emit(Final(round=3, state_hash=H), "final")
    hostile = AttackSent(
        round=1, attack="nan", sender="cd" * 32, header_round=1, message_id="0" * 64, payload_sha256="1" * 64,
        status="OK", reason="", body_sent=True, peer_id="Qm" + "1" * 44,
    )  # fmt: skip
    Events("hostile", tmp_path / "team.jsonl").emit(hostile, "attack")
    log = read_events(tmp_path)
    assert log.final_hashes() == {"validator": H, "follower": H}
    assert log.events(AttackSent, "team") == [hostile] and log.has(AttackSent, round_=1)
    assert not log.has(AttackSent, "validator")
