"""Prometheus metrics derived from the typed events: the sink every role's `Events` can feed.

    metrics = EventMetrics(registry)              # a prometheus_client `CollectorRegistry`
    events = Events("miner", path, sinks=[metrics.record])
    events.emit(Submitted(...), "...")            # updates the metrics that event names

Names follow Prometheus conventions: the `pulse_` prefix, `_total` for counters, base units in the
name (`_seconds`, `_bytes`, `_ratio`). Every label has a small fixed set of values: `kind` and `op`
are chosen here, and a rejection's reason (free text in the signed round result, written by a
validator and at times quoting a peer's input) is reduced to one of `REASON_CLASSES` by
`reason_class`, so no number of fresh keys or crafted payloads can grow a label set.

What the events cannot tell (bytes this node served to others, pushes refused at the stream, peers
known, the process's memory) is collected beside these by the role (`node/roles/metrics.py`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from node.events.models import (
    Baseline,
    CheckpointLoaded,
    Done,
    Event,
    Final,
    Missed,
    PatchApplied,
    Received,
    RolloutsPublished,
    RolloutsRefused,
    RoundClosed,
    RoundOpened,
    Scored,
    Started,
    Submitted,
)

# (class, pattern at the start of the reason): the validator's reasons (validator/intake.py,
# validator/gauntlet.py), first match wins; anything else is "other"
_REASONS: tuple[tuple[str, str], ...] = (
    ("envelope", r"bad envelope|[A-Z][A-Za-z]+: "),  # framing, run, signature or schema of the signed header
    ("round", r"(stale|future) round"),
    ("replay", r"replay of message"),
    ("duplicate", r"second submission from this key"),
    ("round_full", r"round is full"),
    ("codec", r"codec "),
    ("behind", r"behind: "),
    ("unknown_base", r"unknown base state"),
    ("oversize", r"oversize: "),
    ("payload_mismatch", r"payload is \d+ bytes|payload SHA-256 differs"),
    ("data_digest", r"data digest does not match"),
    ("undecodable", r"undecodable: "),
    ("norm", r"update norm overflows|norm \S+ is \S+ the median"),
    ("free_rider", r"free rider: "),
    ("copy", r"copy of "),
    ("no_gain", r"score \S+: no gain"),
    ("indicator", r"indicator average "),
    ("not_positive", r"final score \S+ is not positive"),
    ("rating", r"rating ordinal \S+ is not positive"),
    ("rank", r"final score \S+ ranks \d+"),
)
_REASON_RE = [(name, re.compile(pattern)) for name, pattern in _REASONS]
REASON_CLASSES: tuple[str, ...] = (*(name for name, _ in _REASONS), "other")
"""Every value the `reason` label can take."""

KINDS = ("submission", "patch", "checkpoint")
"""Every value the bytes counters' `kind` label can take."""
CODEC_OPS = ("compress", "patch_encode", "patch_apply")
EVALUATIONS = ("submissions", "held_out")

SIZE_BUCKETS = tuple(1024 * 4**k for k in range(13))  # 1 KiB .. 16 GiB
SECOND_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def reason_class(reason: str | None) -> str:
    """The class of a rejection reason: one of `REASON_CLASSES`."""
    if reason:
        for name, pattern in _REASON_RE:
            if pattern.match(reason):
                return name
    return "other"


class EventMetrics:
    """Counters, gauges and histograms in `registry`, updated by `record(event)`."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.state_hash: str | None = None
        self.state_since: float | None = None  # clock() when this node's state hash last changed
        self.behind = 0  # patches still to apply after the last join
        self._define(registry)

    def _define(self, r: CollectorRegistry) -> None:
        def gauge(name: str, text: str) -> Gauge:
            return Gauge(name, text, registry=r)

        def counter(name: str, text: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, text, labels, registry=r)  # exposed as name + "_total"

        def histogram(name: str, text: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(name, text, labels, buckets=buckets, registry=r)

        # every role: where it is
        self.round = gauge("pulse_round", "The round r whose W_r this node holds (validator: its open round).")
        self.state_age = gauge("pulse_state_age_seconds", "Seconds since this node's state hash last changed.")
        self.state_age.set_function(self._state_age)
        self.sent_bytes = counter("pulse_sent_bytes", "Bytes this node sent, by kind.", ("kind",))
        self.received_bytes = counter("pulse_received_bytes", "Bytes this node received and used, by kind.", ("kind",))
        self.patch_bytes = histogram("pulse_patch_bytes", "PULSESync patch sizes.", SIZE_BUCKETS)
        self.payload_bytes = histogram("pulse_payload_bytes", "Submission payload sizes.", SIZE_BUCKETS)
        self.codec_seconds = histogram("pulse_codec_seconds", "Seconds in codecs, by op.", SECOND_BUCKETS, ("op",))
        self.missed = counter("pulse_missed", "What this node sent that was not taken (a submission, rollouts).")
        # followers and miners: catching up
        self.checkpoints = counter("pulse_checkpoints_loaded", "Checkpoints this node joined (or rejoined) from.")
        self.patches = counter("pulse_patches_applied", "Patches this node applied and verified.")
        self.catchup = gauge("pulse_catchup_patches_remaining", "Patches still to apply after the last join.")
        # miners
        self.sent_submissions = counter("pulse_submissions_sent", "Submissions the validator took from this miner.")
        self.outcomes = counter("pulse_miner_outcomes", "This miner's outcomes in round results.", ("outcome",))
        self.miner_rejected = counter("pulse_miner_rejected", "This miner's rejections, by reason class.", ("reason",))
        self.last_score = gauge("pulse_miner_last_score", "This miner's final score when it was last aggregated.")
        self.last_place = gauge("pulse_miner_last_place", "Place among the aggregated in the last result (0: not).")
        self.last_scored = gauge("pulse_miner_last_scored_round", "The last round whose result named this miner.")
        self.train_loss = gauge("pulse_train_loss", "Mean training loss of this miner's last round of inner steps.")
        self.busy = gauge("pulse_miner_busy_ratio", "Seconds training and compressing / wall seconds since it began.")
        self.step_seconds = histogram("pulse_inner_step_seconds", "Mean seconds of an inner step.", SECOND_BUCKETS)
        # the validator
        self.received = counter("pulse_submissions_received", "Submissions the validator received.")
        self.selected = counter("pulse_submissions_selected", "Submissions the validator aggregated.")
        self.rejected = counter("pulse_submissions_rejected", "Submissions not aggregated, by reason.", ("reason",))
        self.evaluation_seconds = histogram(
            "pulse_evaluation_seconds", "Validator seconds evaluating, per round, by what.", SECOND_BUCKETS, ("what",)
        )
        self.round_seconds = histogram(
            "pulse_validator_round_seconds", "Validator seconds from deciding a round to committing it.", SECOND_BUCKETS
        )
        self.held_out_loss = gauge("pulse_held_out_loss", "Held-out loss of the newest weights.")
        self.held_out_reward = gauge("pulse_held_out_reward", "Held-out reward of the newest weights (RL).")
        self.rollouts = counter("pulse_rollouts_published", "Rollout batches this worker published (RL).")
        self.rollouts_pushed = counter(
            "pulse_rollouts_pushed", "Rollout batches a validator took over a stream (RL; the rest only announced)."
        )
        self.rollouts_refused = counter("pulse_rollouts_refused", "Rollout batches the validator's pool refused (RL).")
        for kind in KINDS:  # every series exists from the start, at 0
            self.sent_bytes.labels(kind)
            self.received_bytes.labels(kind)
        for g in (self.round, self.held_out_loss, self.held_out_reward, self.last_score, self.last_place):
            g.set(math.nan)  # unknown until an event says: a fresh node holds no round, a follower has no place
        for g in (self.last_scored, self.train_loss, self.busy):
            g.set(math.nan)

    def _state_age(self) -> float:
        return math.nan if self.state_since is None else self.clock() - self.state_since

    def _hold(self, round_: int, state_hash: str) -> None:
        self.round.set(round_)
        if state_hash != self.state_hash:
            self.state_hash, self.state_since = state_hash, self.clock()

    def record(self, event: Event) -> None:
        """Update the metrics `event` names; other kinds change nothing."""
        match event:
            case CheckpointLoaded():
                self._checkpoint(event)
            case PatchApplied():
                self._patch(event)
            case Final() | Done():
                self._hold(event.round, event.state_hash)
            case Submitted():
                self._submitted(event)
            case Missed():
                self.missed.inc()
            case Scored():
                self._scored(event)
            case Started(round=int(round_)):  # the validator says where it starts
                self.round.set(round_)
            case Baseline():
                self._held_out(event.loss, event.reward)
            case RoundOpened():
                self._hold(event.round, event.state_hash)
            case Received():
                self._received(event)
            case RoundClosed():
                self._closed(event)
            case RolloutsPublished():
                self.rollouts.inc()
                if event.pushed:
                    self.rollouts_pushed.inc()
            case RolloutsRefused():
                self.rollouts_refused.inc()

    # -- followers and miners: the chain --------------------------------------------------------

    def _checkpoint(self, e: CheckpointLoaded) -> None:
        self._hold(e.round, e.state_hash)
        self.checkpoints.inc()
        self.received_bytes.labels("checkpoint").inc(e.bytes)
        self.behind = e.behind
        self.catchup.set(self.behind)

    def _patch(self, e: PatchApplied) -> None:
        self._hold(e.round + 1, e.state_hash)
        self.patches.inc()
        self.received_bytes.labels("patch").inc(e.patch_bytes)
        self.patch_bytes.observe(e.patch_bytes)
        if e.seconds is not None:
            self.codec_seconds.labels("patch_apply").observe(e.seconds)
        self.behind = max(self.behind - 1, 0)
        self.catchup.set(self.behind)

    # -- miners ---------------------------------------------------------------------------------

    def _submitted(self, e: Submitted) -> None:
        self.sent_submissions.inc()
        self.sent_bytes.labels("submission").inc(e.bytes)
        self.payload_bytes.observe(e.bytes)
        self.train_loss.set(e.loss)
        self.busy.set(e.busy_fraction)
        if e.compress_seconds is not None:
            self.codec_seconds.labels("compress").observe(e.compress_seconds)
        if e.step_seconds is not None:
            self.step_seconds.observe(e.step_seconds)

    def _scored(self, e: Scored) -> None:
        self.last_scored.set(e.round)
        if e.place is not None:
            self.outcomes.labels("aggregated").inc()
            self.last_place.set(e.place)
            self.last_score.set(e.score if e.score is not None else math.nan)
            return
        self.last_place.set(0)
        if e.reason is None:
            self.outcomes.labels("missing").inc()
            return
        self.outcomes.labels("rejected").inc()
        self.miner_rejected.labels(reason_class(e.reason)).inc()

    # -- the validator ----------------------------------------------------------------------------

    def _received(self, e: Received) -> None:
        self.received.inc()
        self.received_bytes.labels("submission").inc(e.bytes)
        self.payload_bytes.observe(e.bytes)

    def _closed(self, e: RoundClosed) -> None:
        self.selected.inc(e.selected)
        for reason in [*e.rejections.values(), *e.ignored]:
            self.rejected.labels(reason_class(reason)).inc()
        self.patch_bytes.observe(e.patch_bytes)
        self.round_seconds.observe(e.seconds)
        for histogram, value in (
            (self.codec_seconds.labels("patch_encode"), e.encode_seconds),
            (self.evaluation_seconds.labels("submissions"), e.decide_seconds),
            (self.evaluation_seconds.labels("held_out"), e.held_out_seconds),
        ):
            if value is not None:
                histogram.observe(value)
        self._held_out(e.loss, e.reward)

    def _held_out(self, loss: float | None, reward: float | None) -> None:
        if loss is not None:
            self.held_out_loss.set(loss)
        if reward is not None:
            self.held_out_reward.set(reward)
