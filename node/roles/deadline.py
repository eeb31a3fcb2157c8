"""When the validator closes a round: the manifest's bounds, and (adaptive) a target learned from arrivals.

    clock = RoundClock(manifest.round)
    clock.target()                                   # seconds after the open: what miners aim for
    clock.should_close(elapsed, received=5, active=6)
    clock.record([2.1, 2.4, 3.0, 9.7])               # a closed round's arrival times (seconds after its open)

Both modes close at `deadline_seconds` at the latest, never before `min_seconds`, and as soon as
every active miner (announced for the round, or a sender of the last one) has submitted.

- fixed: nothing else; the target miners aim for is the deadline.
- adaptive: the target is T = median(A) + k * MAD(A) over A, the arrival times of the last
  `history_rounds` rounds (k = `margin_mads`), clamped to [min_seconds, deadline_seconds]; with no
  history yet, T is the deadline. The round also closes once a quorum (`quorum` of the active
  miners, rounded up) has submitted and T has passed. A straggler that is late every round no
  longer holds every round up to the deadline: it either sends less (`uplink.py`) or misses.

The median and MAD are robust: one miner that is always late (or one that lies about nothing, as
arrival times are measured here) moves T by at most one rank, not by its lateness.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable

from node.run.manifest import RoundSection


class RoundClock:
    def __init__(self, timing: RoundSection) -> None:
        self.timing = timing
        self.history: deque[list[float]] = deque(maxlen=timing.history_rounds)

    @property
    def adaptive(self) -> bool:
        return self.timing.deadline_mode == "adaptive"

    def record(self, arrivals: Iterable[float]) -> None:
        """The arrival times (seconds after the open) of a closed round's submissions."""
        self.history.append([a for a in arrivals if math.isfinite(a) and a >= 0])

    def target(self) -> float:
        """Seconds after the open by which submissions are expected (what miners budget for)."""
        t = self.timing
        arrivals = [a for round_ in self.history for a in round_]
        if not self.adaptive or not arrivals:
            return t.deadline_seconds
        median = statistics.median(arrivals)
        mad = statistics.median(abs(a - median) for a in arrivals)
        return min(max(median + t.margin_mads * mad, t.min_seconds), t.deadline_seconds)

    def quorum(self, active: int) -> int:
        return max(1, math.ceil(self.timing.quorum * active))

    def should_close(self, elapsed: float, *, received: int, active: int) -> bool:
        """Whether a round open for `elapsed` seconds, with `received` of `active` miners in, closes now."""
        t = self.timing
        if elapsed >= t.deadline_seconds:
            return True
        if elapsed < t.min_seconds or received == 0:
            return False
        if received >= active:
            return True
        return self.adaptive and received >= self.quorum(active) and elapsed >= self.target()
