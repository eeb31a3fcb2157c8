"""When the validator closes a round: the manifest's bounds, and (adaptive) a target learned from arrivals.

    clock = RoundClock(manifest.round)
    clock.target()                                   # seconds after the open: what miners aim for
    clock.should_close(elapsed, received=5, active=6)
    clock.record([2.1, 2.4, 3.0, 9.7], active=5)     # a closed round's arrival times (seconds after its open)

Both modes close at `deadline_seconds` at the latest, never before `min_seconds`, and as soon as
every active miner (announced for the round, or a sender of the last one whose update was
aggregated) has submitted. A miner without standing that announced itself (a free heartbeat) counts
in no quorum, and once every miner the round knew is in it is waited for `NEWCOMER_WAIT` times as
long as they took, no more: a flood of announcements cannot hold every round to its deadline. A
newcomer that misses its first round trains the next one ahead (`roles/miner.py`) and is in at its
open, and known from then on once it is aggregated (`senders_to_wait_for`).

- fixed: nothing else; the target miners aim for is the deadline.
- adaptive: over the last `history_rounds` rounds, with A_r the arrival times of round r's quorum,
  T = M + max(k * S, MIN_MARGIN * M), where M is the median over rounds of median(A_r) and S the
  median over all arrivals of |a - median(A_r)| (the spread within rounds; k = `margin_mads`),
  clamped to [min_seconds, deadline_seconds]; with no history yet, T is the deadline. The round
  also closes once a quorum (`quorum` of the active miners, rounded up) has submitted and T has
  passed. A straggler that is late every round no longer holds every round up to the deadline: it
  either sends less (`uplink.py`) or misses.

Only the quorum's arrivals (the earliest `quorum` of the round's active miners) are learned from:
the target says when the miners a round needs are in, so the miners it does not wait for do not
move it. Otherwise a slow miner that shrinks its payload to land just before T adds an arrival at
T, which pulls the next T later, which lets it send more and land later still: the target would
drift after the slowest miner the rounds were meant to stop waiting for. The floor on the margin
(a share of the median) keeps T off the median itself when the quorum arrives all at once (MAD 0):
a miner at the median still has room for its upload's jitter. The spread is measured within each
round, around that round's own median: one slow round (the first, with its cold start) moves M by
one rank among the rounds, where pooled with the others it would widen the margin by k times its
lateness for as long as it stays in the history.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable

from node.run.manifest import RoundSection

MIN_MARGIN = 0.25  # the margin above the median is at least this share of the median
NEWCOMER_WAIT = 2.0  # newcomers get as long again as the miners a round knows took to be in


class RoundClock:
    def __init__(self, timing: RoundSection) -> None:
        self.timing = timing
        self.history: deque[list[float]] = deque(maxlen=timing.history_rounds)

    @property
    def adaptive(self) -> bool:
        return self.timing.deadline_mode == "adaptive"

    def record(self, arrivals: Iterable[float], *, active: int | None = None) -> None:
        """The arrival times (seconds after the open) of a closed round's submissions, of `active`
        miners (default: as many as arrived); the earliest of the round's quorum are kept."""
        valid = sorted(a for a in arrivals if math.isfinite(a) and a >= 0)
        active = len(valid) if active is None else max(active, len(valid))
        self.history.append(valid[: self.quorum(active)])

    def target(self) -> float:
        """Seconds after the open by which submissions are expected (what miners budget for)."""
        t = self.timing
        rounds = [(statistics.median(r), r) for r in self.history if r]
        if not self.adaptive or not rounds:
            return t.deadline_seconds
        median = statistics.median(m for m, _ in rounds)
        spread = statistics.median(abs(a - m) for m, r in rounds for a in r)
        margin = max(t.margin_mads * spread, MIN_MARGIN * median)
        return min(max(median + margin, t.min_seconds), t.deadline_seconds)

    def quorum(self, active: int) -> int:
        return max(1, math.ceil(self.timing.quorum * active))

    def should_close(
        self, elapsed: float, *, received: int, active: int, newcomers: int = 0, known_in: float | None = None
    ) -> bool:
        """Whether a round open for `elapsed` seconds, with `received` of `active` miners in, closes
        now. `newcomers` more announced themselves without standing (their announcements cost
        nothing): waited for until the quorum of the others and the target close the round, or, once
        every miner the round knew was in (`known_in` seconds after the open), as long again."""
        t = self.timing
        if elapsed >= t.deadline_seconds:
            return True
        if elapsed < t.min_seconds or received == 0:
            return False
        if received >= active + newcomers:
            return True
        if received >= active and known_in is not None and elapsed >= NEWCOMER_WAIT * known_in:
            return True
        return self.adaptive and received >= self.quorum(active) and elapsed >= self.target()
