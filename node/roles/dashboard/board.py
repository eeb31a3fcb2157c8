"""What the run page shows, derived from verified signed records only (pure: no network, no clock).

    seen = Seen()                      # every record the watcher has read (the DHT forgets old ones)
    seen.add_result(result)            # the validator's RoundResult
    seen.add_metrics(metrics)          # its RoundMetrics (held-out loss, bytes, standings)
    seen.add_heartbeat(sender, beat)   # anyone's heartbeat
    seen.add_header(header)            # a miner's announced submission
    board = build_board(run, seen, now)
    board.history(key)                 # one miner's outcomes, round by round (the window's)

The board is a window, whatever the run's length and however many keys submit: the last
`WINDOW_ROUNDS` rounds (rows, outcomes, a miner's history), the top `TOP_MINERS` of the
leaderboard; only the hash chain's check looks at every round seen. A page or its JSON after
1,000 rounds of 120 miners is the size of one after `WINDOW_ROUNDS`.

The caller verifies signatures and keeps only results and metrics signed by the run's
validators; this module trusts what it is given and bounds what it keeps (anyone can make
keys and heartbeats for free). What is checkable and what is only reported: outcomes, scores,
reasons and the hash chain come from signed results that link to each other; held-out loss,
byte counts and ratings are the validator's signed word (`RoundMetrics`); heartbeats are each
node's own claim about itself.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TypeVar

from protocol.messages import Heartbeat, RoundMetrics, RoundResult, SubmissionHeader

T = TypeVar("T")
MAX_ROUNDS = 100_000  # rounds of results and metrics kept (a few KiB each)
MAX_NODES = 2_048  # heartbeat senders kept, newest first: fresh keys cannot grow the page without bound
MAX_HEADERS = 512  # announced submissions kept for the open round
RECENT_ROUNDS = 3  # rounds whose every submission the page lists
WINDOW_ROUNDS = 60  # rounds the board shows (rows, charts, leaderboard counts, a miner's history)
TOP_MINERS = 40  # leaderboard rows
PACE_ROUNDS = 8  # recent round openings the pace (seconds a round) is measured over


@dataclass(frozen=True)
class RunFacts:
    """The run as the page names it (from the manifest)."""

    name: str
    run_id: str
    validators: frozenset[str]
    deadline_seconds: float
    task: str  # "lm" or "rl"


@dataclass
class Seen:
    """Every verified record read so far, bounded; `version` counts the changes (a board cache key)."""

    results: dict[int, RoundResult] = field(default_factory=dict)
    metrics: dict[int, RoundMetrics] = field(default_factory=dict)
    beats: OrderedDict[str, Heartbeat] = field(default_factory=OrderedDict)  # newest last
    opened: dict[int, int] = field(default_factory=dict)  # round -> first validator heartbeat time seen
    headers: dict[int, dict[str, SubmissionHeader]] = field(default_factory=dict)
    version: int = 0

    def add_result(self, result: RoundResult) -> None:
        if self.results.get(result.round) != result:
            self.results[result.round] = result
            _trim(self.results, MAX_ROUNDS)
            self.version += 1

    def add_metrics(self, metrics: RoundMetrics) -> None:
        if self.metrics.get(metrics.round) != metrics:
            self.metrics[metrics.round] = metrics
            _trim(self.metrics, MAX_ROUNDS)
            self.version += 1

    def add_heartbeat(self, sender: str, beat: Heartbeat, *, from_validator: bool) -> None:
        old = self.beats.get(sender)
        if old is not None and (old.round, old.sent_at) >= (beat.round, beat.sent_at):
            return
        self.beats[sender] = beat
        self.beats.move_to_end(sender)
        while len(self.beats) > MAX_NODES:
            self.beats.popitem(last=False)
        if from_validator and beat.role == "validator":
            # the validator's heartbeat opening a round starts its deadline clock
            self.opened[beat.round] = min(self.opened.get(beat.round, beat.sent_at), beat.sent_at)
            _trim(self.opened, MAX_ROUNDS)
        self.version += 1

    def add_header(self, header: SubmissionHeader) -> None:
        by_sender = self.headers.setdefault(header.round, {})
        if len(by_sender) < MAX_HEADERS and by_sender.get(header.sender) != header:
            by_sender[header.sender] = header
            self.version += 1
        _trim(self.headers, RECENT_ROUNDS + 1)

    def last_round(self) -> int:
        """The last round with a result, -1 if none."""
        return max(self.results, default=-1)


@dataclass(frozen=True)
class Outcome:
    """One submission's fate, as the round's signed result gives it."""

    round: int
    sender: str
    payload_sha256: str
    aggregated: bool
    score: float | None  # the final score it was ranked by (aggregated ones)
    reason: str | None  # why it was not aggregated
    place: int | None  # 1 = highest score among the aggregated
    of: int  # submissions the result names


@dataclass(frozen=True)
class RoundRow:
    round: int
    loss: float | None
    reward: float | None
    aggregated: int
    named: int
    received_bytes: int | None
    dense_bytes: int | None
    patch_bytes: int
    new_state_hash: str
    linked: bool | None  # starts from the state the previous round produced (None: previous not seen)


@dataclass(frozen=True)
class MinerRow:
    key: str
    rating: float | None
    indicator: float | None
    last: Outcome
    aggregated_rounds: int
    submissions: int


@dataclass(frozen=True)
class NodeRow:
    key: str
    role: str
    round: int
    state_hash: str | None
    seconds_ago: float


@dataclass(frozen=True)
class RunBoard:
    run: RunFacts
    now: float
    current_round: int  # the open round (one past the last result)
    time_left: float | None  # seconds until the open round's target (or deadline), if its opening was seen
    pace: float | None  # seconds a round lasted lately (between the validator's openings), if seen
    rounds: list[RoundRow]  # the last WINDOW_ROUNDS rounds seen, oldest first
    leaderboard: list[MinerRow]  # the TOP_MINERS highest rated
    recent: list[Outcome]  # every submission of the last RECENT_ROUNDS rounds, newest round first
    nodes: list[NodeRow]  # heartbeats of the open round or the one before
    announced: int  # submission headers in the DHT for the open round
    head: str | None  # the newest state hash: W_{current_round}
    chain_ok: bool  # every pair of consecutive rounds seen links up
    outcomes: dict[str, list[Outcome]]  # by miner, oldest first, within the window

    @property
    def completed(self) -> int:
        return len(self.rounds)

    def online(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.role] = counts.get(node.role, 0) + 1
        return counts

    def history(self, key: str) -> list[Outcome]:
        return self.outcomes.get(key, [])


def build_board(run: RunFacts, seen: Seen, now: float) -> RunBoard:
    current = seen.last_round() + 1
    beat = _validator_beat(seen, run)
    if beat is not None and beat.round > current:
        current = beat.round
    opened = seen.opened.get(current)
    window = sorted(seen.results)[-WINDOW_ROUNDS:]
    rounds = _round_rows(seen, window)
    outcomes: dict[str, list[Outcome]] = {}
    for r in window:
        for outcome in outcomes_of(seen.results[r]):
            outcomes.setdefault(outcome.sender, []).append(outcome)
    recent_rounds = window[-RECENT_ROUNDS:]
    # the round closes at the validator's adaptive target when it names one (rounds that close in
    # 1.5 s showed the 40 s deadline), never later than the deadline
    target = run.deadline_seconds
    if beat is not None and beat.target_seconds is not None:
        target = min(target, beat.target_seconds)
    return RunBoard(
        run=run,
        now=now,
        current_round=current,
        time_left=None if opened is None else opened + target - now,
        pace=_pace(seen),
        rounds=rounds,
        leaderboard=_leaderboard(seen, outcomes)[:TOP_MINERS],
        recent=[o for r in reversed(recent_rounds) for o in outcomes_of(seen.results[r])],
        nodes=_nodes(seen, current, now),
        announced=len(seen.headers.get(current, {})),
        head=seen.results[current - 1].new_state_hash if current - 1 in seen.results else None,
        chain_ok=all(_linked(seen, r) is not False for r in seen.results),
        outcomes=outcomes,
    )


def outcomes_of(result: RoundResult) -> list[Outcome]:
    """Aggregated submissions by score (places 1, 2, ...), then the others with their reasons."""
    named = len(result.selected) + len(result.rejections)
    ranked = sorted(result.selected, key=lambda s: (-s.score, s.sender))
    out = [
        Outcome(result.round, s.sender, s.payload_sha256, True, s.score, None, i + 1, named)
        for i, s in enumerate(ranked)
    ]
    out += [
        Outcome(result.round, r.sender, r.payload_sha256, False, None, r.reason, None, named) for r in result.rejections
    ]
    return out


def _linked(seen: Seen, r: int) -> bool | None:
    """Round r starts from the state round r-1 produced (None: r-1 not seen)."""
    before = seen.results.get(r - 1)
    return None if before is None else before.new_state_hash == seen.results[r].base_state_hash


def _pace(seen: Seen) -> float | None:
    """Seconds a round lasted lately: the span of the last `PACE_ROUNDS` openings seen over the rounds between."""
    opened = sorted(seen.opened.items())[-PACE_ROUNDS:]
    if len(opened) < 2:
        return None
    (first, t0), (last, t1) = opened[0], opened[-1]
    return max(t1 - t0, 0) / (last - first)


def _round_rows(seen: Seen, window: list[int]) -> list[RoundRow]:
    rows = []
    for r in window:
        result, metrics = seen.results[r], seen.metrics.get(r)
        rows.append(
            RoundRow(
                round=r,
                loss=metrics.held_out_loss if metrics else None,
                reward=metrics.held_out_reward if metrics else None,
                aggregated=len(result.selected),
                named=len(result.selected) + len(result.rejections),
                received_bytes=metrics.received_bytes if metrics else None,
                dense_bytes=metrics.dense_bytes if metrics else None,
                patch_bytes=result.patch_size,
                new_state_hash=result.new_state_hash,
                linked=_linked(seen, r),
            )
        )
    return rows


def _leaderboard(seen: Seen, outcomes: dict[str, list[Outcome]]) -> list[MinerRow]:
    standing: dict[str, tuple[float, float]] = {}
    for r in sorted(seen.metrics):
        for s in seen.metrics[r].standings:
            standing[s.sender] = (s.rating, s.indicator)
    rows = [
        MinerRow(
            key=key,
            rating=standing[key][0] if key in standing else None,
            indicator=standing[key][1] if key in standing else None,
            last=history[-1],
            aggregated_rounds=sum(o.aggregated for o in history),
            submissions=len(history),
        )
        for key, history in outcomes.items()
    ]
    unrated = float("-inf")
    return sorted(rows, key=lambda m: (-(m.rating if m.rating is not None else unrated), -m.aggregated_rounds, m.key))


def _validator_beat(seen: Seen, run: RunFacts) -> Heartbeat | None:
    beats = [b for k, b in seen.beats.items() if k in run.validators and b.role == "validator"]
    return max(beats, key=lambda b: (b.round, b.sent_at), default=None)


def _nodes(seen: Seen, current: int, now: float) -> list[NodeRow]:
    rows = [
        NodeRow(key, b.role, b.round, b.state_hash, max(0.0, now - b.sent_at))
        for key, b in seen.beats.items()
        if b.round >= current - 1
    ]
    return sorted(rows, key=lambda n: (n.role, n.key))


def _trim(table: dict[int, T], keep: int) -> None:
    while len(table) > keep:
        del table[min(table)]
