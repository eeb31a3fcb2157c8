"""The run page in process: the board derived from signed records, its HTML and SVG, the watcher
reading through a peer's interface, and the HTTP server (a real browser: tests/swarm/test_watched_swarm.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from node.net.dht import sign_for
from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.roles.dashboard.board import MAX_NODES, RunFacts, Seen, build_board
from node.roles.dashboard.render import page
from node.roles.dashboard.server import DashboardServer
from node.roles.dashboard.watch import Watcher
from protocol.identity import Identity
from protocol.messages import (
    Heartbeat,
    Rejection,
    RoundMetrics,
    RoundResult,
    ScoredSubmission,
    Standing,
    SubmissionHeader,
    WireModel,
)
from tests.helpers import commitments

VALIDATOR = Identity.from_seed(b"v" * 32)
MINERS = [Identity.from_seed(bytes([i]) * 32).public_hex for i in range(1, 4)]
HOSTILE = Identity.from_seed(b"h" * 32).public_hex
RUN = RunFacts("tiny", "ab" * 32, frozenset({VALIDATOR.public_hex}), deadline_seconds=40.0, task="lm")
PEER_ID = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def result(r: int, base: str | None = None, reason: str = "undecodable: NonFiniteValues: NaN or inf") -> RoundResult:
    return RoundResult(
        run_id=RUN.run_id,
        round=r,
        selected=(
            ScoredSubmission(sender=MINERS[0], payload_sha256=h(f"a{r}"), score=0.5 + r),
            ScoredSubmission(sender=MINERS[1], payload_sha256=h(f"b{r}"), score=0.25),
        ),
        rejections=(Rejection(sender=HOSTILE, payload_sha256=h(f"x{r}"), reason=reason),),
        base_state_hash=base or h(f"w{r}"),
        patch_sha256=h(f"p{r}"),
        patch_size=1000 + r,
        new_state_hash=h(f"w{r + 1}"),
        **commitments(str(r)),
    )


def metrics(r: int, loss: float) -> RoundMetrics:
    return RoundMetrics(
        run_id=RUN.run_id,
        round=r,
        held_out_loss=loss,
        held_out_reward=None,
        submissions=3,
        received_bytes=30_000,
        dense_bytes=6_000_000,
        standings=(
            Standing(sender=MINERS[0], rating=2.0 + r, indicator=1.0),
            Standing(sender=MINERS[1], rating=1.0, indicator=0.5),
            Standing(sender=HOSTILE, rating=-3.0, indicator=-1.0),
        ),
    )


def beat(role: str, r: int, sent_at: int) -> Heartbeat:
    return Heartbeat(
        run_id=RUN.run_id, round=r, role=role, peer_id=PEER_ID, state_hash=h(f"w{r}"), blobs=(), sent_at=sent_at
    )  # type: ignore[arg-type]


def header(sender: str, r: int) -> SubmissionHeader:
    return SubmissionHeader(
        run_id=RUN.run_id,
        round=r,
        base_state_hash=h(f"w{r}"),
        payload_sha256=h(f"c{r}"),
        payload_size=10,
        codec="sparseloco",
        data_digest=h("d"),
        sender=sender,
    )


def three_rounds() -> Seen:
    seen = Seen()
    for r, loss in enumerate((5.4, 4.1, 3.6)):
        seen.add_result(result(r))
        seen.add_metrics(metrics(r, loss))
    seen.add_heartbeat(VALIDATOR.public_hex, beat("validator", 3, 1_000), from_validator=True)
    seen.add_heartbeat(VALIDATOR.public_hex, beat("validator", 3, 1_030), from_validator=True)  # a later one
    seen.add_heartbeat(MINERS[0], beat("miner", 3, 1_001), from_validator=False)
    seen.add_heartbeat(MINERS[1], beat("miner", 1, 900), from_validator=False)  # too old to be online
    seen.add_heartbeat("cd" * 32, beat("follower", 2, 1_002), from_validator=False)
    seen.add_header(header(MINERS[0], 3))
    return seen


def test_board_from_signed_records() -> None:
    board = build_board(RUN, three_rounds(), now=1_010.0)
    assert board.current_round == 3 and board.completed == 3
    assert board.time_left == pytest.approx(30.0)  # the deadline runs from the first heartbeat of the round
    assert [(r.round, r.loss) for r in board.rounds] == [(0, 5.4), (1, 4.1), (2, 3.6)]
    assert board.head == h("w3") and board.chain_ok
    assert [m.key for m in board.leaderboard] == [MINERS[0], MINERS[1], HOSTILE]
    top = board.leaderboard[0]
    assert (top.rating, top.last.place, top.last.of, top.aggregated_rounds) == (4.0, 1, 3, 3)
    assert board.leaderboard[2].last.reason == "undecodable: NonFiniteValues: NaN or inf"
    assert [(o.round, o.sender) for o in board.recent[:3]] == [(2, MINERS[0]), (2, MINERS[1]), (2, HOSTILE)]
    assert board.online() == {"validator": 1, "miner": 1, "follower": 1} and board.announced == 1
    assert [o.round for o in board.history(HOSTILE)] == [0, 1, 2] and board.history("ee" * 32) == []


def test_board_follows_the_chain_and_bounds_what_it_keeps() -> None:
    seen = Seen()
    seen.add_result(result(0))
    seen.add_result(result(1, base=h("w1")))  # starts where round 0 ended
    assert build_board(RUN, seen, 0.0).chain_ok
    seen.add_result(result(2, base=h("elsewhere")))
    board = build_board(RUN, seen, 0.0)
    assert not board.chain_ok and [r.linked for r in board.rounds] == [None, True, False]
    assert board.time_left is None and board.rounds[0].loss is None  # no heartbeat, no metrics: unknown
    for i in range(MAX_NODES + 10):  # a flood of fresh keys' heartbeats
        seen.add_heartbeat(f"{i:064x}", beat("miner", 3, 5), from_validator=False)
    assert len(seen.beats) == MAX_NODES


def test_page_shows_round_loss_points_and_rejections_escaped() -> None:
    seen = three_rounds()
    seen.add_result(result(3, reason="<script>alert(1)</script> & more"))
    html = page(build_board(RUN, seen, now=1_010.0), miner=HOSTILE)
    assert re.search(r'id="current-round">4<', html)
    assert len(re.findall(r'<circle class="point" data-round="\d+"', html)) == 3  # round 3 has no metrics yet
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in html and "<script>alert" not in html
    assert 'id="miner-history"' in html and html.count("not aggregated") >= 4
    assert 'data-series="sent (compressed)"' in html and 'id="nodes"' in html
    assert "not a miner key" in page(build_board(RUN, seen, 0.0), miner="<b>")


def test_watcher_reads_validator_records_only_and_catches_late_metrics(tmp_path: Path) -> None:
    network = MemoryNetwork(RunRecords(RUN.run_id, tuple(RUN.validators), record_ttl_seconds=3600, checkpoint_every=5))

    def put(identity: Identity, message: WireModel) -> bool:
        return network.store(sign_for(identity, message, 3600))

    impostor = Identity.generate()
    for r in range(3):
        assert put(VALIDATOR, result(r))
        assert not put(impostor, metrics(r, 0.01))  # signed, but not by a validator of the run: refused
    assert put(VALIDATOR, metrics(0, 5.0))
    assert put(VALIDATOR, beat("validator", 3, 100))
    put(Identity.from_seed(b"\x01" * 32), header(MINERS[0], 3))
    watcher = Watcher(network.join(Identity.generate(), tmp_path, role="follower"), RUN, history=2)
    asyncio.run(watcher.poll())
    board = watcher.board(now=110.0)
    assert [r.round for r in board.rounds] == [1, 2] and board.current_round == 3  # history: the last 2 rounds
    assert [r.loss for r in board.rounds] == [None, None] and board.time_left == pytest.approx(30.0)
    assert board.announced == 1
    assert watcher.board(now=110.2) is board  # nothing new within the same second: the same board
    asyncio.run(watcher.poll())
    assert watcher.board(now=110.2) is board  # a pass that found nothing new changes nothing
    put(VALIDATOR, metrics(2, 3.0))  # published after its result
    put(VALIDATOR, result(3))
    asyncio.run(watcher.poll())
    assert [(r.round, r.loss) for r in watcher.board(now=110.2).rounds] == [(1, None), (2, 3.0), (3, None)]


def test_the_watcher_follows_the_first_chain_and_names_a_fork(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A second process signing with the validator's key publishes a round that starts elsewhere:
    the page stays on the chain it read, says so in one line, and goes on once the chain does."""
    network = MemoryNetwork(RunRecords(RUN.run_id, tuple(RUN.validators), record_ttl_seconds=3600, checkpoint_every=5))
    for r in range(2):
        assert network.store(sign_for(VALIDATOR, result(r, base=h(f"w{r}")), 3600))
    assert network.store(sign_for(VALIDATOR, result(2, base=h("elsewhere")), 3600))
    watcher = Watcher(network.join(Identity.generate(), tmp_path, role="follower"), RUN)
    with caplog.at_level(logging.WARNING):
        asyncio.run(watcher.poll())
        asyncio.run(watcher.poll())
    board = watcher.board(now=0.0)
    assert [r.round for r in board.rounds] == [0, 1] and board.chain_ok
    forks = [rec.getMessage() for rec in caplog.records if "fork" in rec.getMessage()]
    assert len(forks) == 1 and "round 2" in forks[0] and h("elsewhere")[:12] in forks[0], forks
    assert network.store(sign_for(VALIDATOR, result(2, base=h("w2")), 3600))  # the first chain goes on
    asyncio.run(watcher.poll())
    assert [r.round for r in watcher.board(now=0.0).rounds] == [0, 1, 2] and watcher.board(now=0.0).chain_ok


def test_server_serves_the_page_the_json_and_nothing_else() -> None:
    board = build_board(RUN, three_rounds(), now=1_010.0)
    server = DashboardServer(lambda: board, port=0)
    url = server.start()
    try:
        with urllib.request.urlopen(url + f"?miner={HOSTILE}", timeout=10) as response:
            html = response.read().decode()
        assert 'id="current-round">3<' in html and 'id="miner-history"' in html
        with urllib.request.urlopen(url + "board.json", timeout=10) as response:
            data = json.loads(response.read())
        assert data["current_round"] == 3 and data["online"]["miner"] == 1 and len(data["rounds"]) == 3
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url + "../etc/passwd", timeout=10)
        assert missing.value.code == 404
    finally:
        server.stop()


def test_time_left_follows_the_validators_target_and_the_pace_when_rounds_close_fast() -> None:
    """Rounds that close in ~1.5 s at a 40 s deadline: the page showed "unknown" or 38 s."""
    seen = Seen()
    for r in range(6):
        seen.add_result(result(r, base=h(f"w{r}")))
    fast = beat("validator", 6, 1_000).model_copy(update={"target_seconds": 1.5})
    seen.add_heartbeat(VALIDATOR.public_hex, fast, from_validator=True)
    board = build_board(RUN, seen, now=1_001.0)
    assert board.time_left == pytest.approx(0.5)  # the target, not the 40 s deadline
    assert 'id="time-left">0.5 s<' in page(board)
    missed = Seen()  # the page read no opening of the open round, only earlier ones, 3 rounds in 4 s
    for r, t in ((0, 100), (1, 101), (2, 103), (3, 104)):
        missed.add_heartbeat(VALIDATOR.public_hex, beat("validator", r, t), from_validator=True)
        missed.add_result(result(r, base=h(f"w{r}")))
    board = build_board(RUN, missed, now=110.0)
    assert board.current_round == 4 and board.time_left is None and board.pace == pytest.approx(4 / 3)
    assert 'id="time-left">rounds close every 1.3 s<' in page(board)


def test_a_reason_the_signed_result_cut_ends_at_a_whole_word_with_a_pointer() -> None:
    cut = "not selected: below the seats' cut (final scor..."
    html = page(build_board(RUN, _one(result(0, reason=cut)), now=0.0))
    assert "(final scor" not in html  # cut mid-word before
    assert "below the seats&#x27; cut (final <abbr" in html and "pulse receipt --round 0" in html


def _one(res: RoundResult) -> Seen:
    seen = Seen()
    seen.add_result(res)
    return seen


def test_the_page_and_its_json_stay_bounded_after_1000_rounds_of_120_miners() -> None:
    """A window (issue: the page and JSON grew with every round and key): last rounds, top miners."""
    from node.roles.dashboard.board import TOP_MINERS, WINDOW_ROUNDS
    from node.roles.dashboard.server import board_json

    keys = [hashlib.sha256(bytes([i])).hexdigest() for i in range(120)]

    def crowded(r: int) -> RoundResult:
        selected = tuple(
            ScoredSubmission(sender=k, payload_sha256=h(f"{k}{r}"), score=float(i)) for i, k in enumerate(keys[:8])
        )
        rejected = tuple(Rejection(sender=k, payload_sha256=h(f"{k}{r}"), reason="not selected") for k in keys[8:])
        return result(r).model_copy(
            update={"selected": selected, "rejections": rejected, "base_state_hash": h(f"w{r}")}
        )

    def sizes(rounds: int) -> tuple[int, int]:
        seen = Seen()
        for r in range(rounds):
            seen.add_result(crowded(r))
        board = build_board(RUN, seen, now=0.0)
        assert len(board.rounds) <= WINDOW_ROUNDS and len(board.leaderboard) <= TOP_MINERS
        assert len(board.history(keys[0])) <= WINDOW_ROUNDS and board.chain_ok
        return len(page(board, miner=keys[0])), len(json.dumps(board_json(board)))

    short, long = sizes(WINDOW_ROUNDS), sizes(1_000)
    assert long[0] <= short[0] * 1.05 and long[1] <= short[1] * 1.05  # the same size as a run of the window
