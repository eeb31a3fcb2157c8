"""Who has standing with this node, and the rate budgets that fresh peer ids and keys share.

    standing = Standing()
    standing.grant(peer_id, seconds=600)     # a validator's peer, a holder that delivered a verified blob
    peer_id in standing                      # may take the reserved slots (`transfer.Slots`)
    gate = ProbeGate(per_key_per_minute=4, unknown_bytes_per_second=1 << 20)
    gate.admit(key_hex, length, standing=False)   # None, or the reason a probe is refused

Peer ids and keys cost nothing, so no per-peer limit bounds a flood; what does is a total budget
with a share only peers with standing may take. Standing is earned by what a fresh id cannot fake
cheaply: being one of the run's validators' peers, or having delivered a hash-checked blob to
this node. Both tables are bounded: a flood pushes out the oldest entries, never grows them.
"""

from __future__ import annotations

import time
from collections import OrderedDict

STANDING_SECONDS = 1800.0  # how long a peer keeps standing after it last earned it
MAX_STANDING = 4096
MAX_PROBE_KEYS = 4096


class Standing:
    """Peer ids (base58 text) that may take reserved slots, each until its grant expires."""

    def __init__(self, capacity: int = MAX_STANDING) -> None:
        self.capacity = capacity
        self._until: OrderedDict[str, float] = OrderedDict()

    def grant(self, peer_id: object, seconds: float = STANDING_SECONDS) -> None:
        name = _name(peer_id)
        self._until.pop(name, None)
        self._until[name] = time.monotonic() + seconds
        while len(self._until) > self.capacity:
            self._until.popitem(last=False)

    def __contains__(self, peer_id: object) -> bool:
        until = self._until.get(_name(peer_id))
        return until is not None and until > time.monotonic()

    def __len__(self) -> int:
        return len(self._until)


class TokenBucket:
    """`rate` units a second, at most `burst` saved up; `take` spends them or refuses."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self._level, self._at = burst, time.monotonic()

    def take(self, amount: float) -> bool:
        now = time.monotonic()
        self._level = min(self.burst, self._level + (now - self._at) * self.rate)
        self._at = now
        if amount > self._level:
            return False
        self._level -= amount
        return True


class ProbeGate:
    """Link probes: a few per signing key a minute, and the bytes of peers without standing under a
    total rate (their share of this node's uplink); peers with standing skip the total only."""

    def __init__(self, per_key_per_minute: int, unknown_bytes_per_second: float, burst_seconds: float = 16.0) -> None:
        self.per_key_per_minute = per_key_per_minute
        self.unknown = TokenBucket(unknown_bytes_per_second, unknown_bytes_per_second * burst_seconds)
        self._keys: OrderedDict[str, TokenBucket] = OrderedDict()

    def admit(self, key_hex: str, length: int, *, standing: bool) -> str | None:
        """None if the probe may run (its budget is spent), else why it may not."""
        bucket = self._keys.pop(key_hex, None) or TokenBucket(self.per_key_per_minute / 60, self.per_key_per_minute)
        self._keys[key_hex] = bucket
        while len(self._keys) > MAX_PROBE_KEYS:
            self._keys.popitem(last=False)
        if not bucket.take(1):
            return f"at most {self.per_key_per_minute} probes a minute per key"
        if not standing and not self.unknown.take(length):
            return "the probe budget for peers without standing is spent; try again later"
        return None


def _name(peer_id: object) -> str:
    to_base58 = getattr(peer_id, "to_base58", None)
    return to_base58() if callable(to_base58) else str(peer_id)
