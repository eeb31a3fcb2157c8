"""How much of its payload a miner can send in time, from what its pushes took.

    uplink = Uplink()
    fraction = uplink.fraction(seconds_left=opened + target - now - compress_s)   # 1.0 until measured
    ... push ...
    uplink.measured(bytes_sent, seconds, fraction)

A push is timed from its start to the validator's confirmation, so the rate includes opening the
stream and the validator's checks: what the round's clock sees. The rate and the size of a full
payload (bytes / fraction sent) are running averages. When the full payload would arrive after the
round's target (the validator's open heartbeat names it; `deadline.py`), the miner sends the
share of it that fits, with `SAFETY` to spare, never less than `MIN_FRACTION`: the codec then sends
fewer values per chunk, and what it leaves out stays in the error-feedback buffer for later rounds.
"""

from __future__ import annotations

SAFETY = 0.5  # aim to be done with this share of the time left: a push also has a fixed cost the
# rate leaves out (its stream, the validator's checks, which weigh most on a small shrunk payload), and
# a round whose quorum is in closes at its target, so a payload landing just before it is often late
MIN_FRACTION = 1 / 64  # SparseLoCo at k=64 then sends one value per chunk
SMOOTHING = 0.5  # weight of the newest measurement
MIN_TIMED_BYTES = 16 * 1024  # smaller pushes are mostly latency: they say little about the rate


class Uplink:
    def __init__(self) -> None:
        self.rate: float | None = None  # bytes/s
        self.full_bytes: float | None = None  # a whole payload's size

    def measured(self, nbytes: int, seconds: float, fraction: float) -> None:
        """A push of `nbytes` (a `fraction` of a whole payload) took `seconds`."""
        full = nbytes / max(fraction, MIN_FRACTION)
        self.full_bytes = full if self.full_bytes is None else _blend(self.full_bytes, full)
        if nbytes >= MIN_TIMED_BYTES and seconds > 0:
            rate = nbytes / seconds
            self.rate = rate if self.rate is None else _blend(self.rate, rate)

    def seconds_for(self, nbytes: float) -> float | None:
        return nbytes / self.rate if self.rate else None

    def fraction(self, seconds_left: float) -> float:
        """The share of a whole payload to send so that it arrives within `seconds_left` (1.0 if unknown)."""
        if self.rate is None or self.full_bytes is None:
            return 1.0
        fits = self.rate * max(seconds_left, 0.0) * SAFETY / self.full_bytes
        return min(1.0, max(MIN_FRACTION, fits))


def _blend(old: float, new: float) -> float:
    return (1 - SMOOTHING) * old + SMOOTHING * new
