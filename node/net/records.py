"""Who may write which DHT record, and how many records one DHT peer keeps: the store-time rules.

    rules = RecordRules(run_id, validators=(key_a, key_b))   # the run's validator keys, in priority order
    rules.policy("heartbeat")                                # KindPolicy(writers="anyone", ...)
    budget = StoreBudget(rules)                              # one per storage of one DHT peer
    admitted = budget.admit(key, owner, envelope, now)       # store it? and what to evict first

Anyone can make a thousand keys for free, so a limit per key or per signer alone is no limit.
Every record kind has a row in `POLICIES`:

- `writers`: "validators" kinds (round results, checkpoints, rollout pools, and the kinds that
  follow them) are refused at store time unless one of the run's validator keys signed them, so a
  flood of fresh keys cannot fill the key a follower waits on;
- `max_value_bytes`: the largest record of the kind (each kind's worst case fits, see the tests);
- `max_signers`: how many open signers (not validators) one key keeps; once full, later ones are
  refused, so a `get` returns a bounded answer.

Records of the run's validators never count against a budget (there are at most 16 keys, and
they are the ones a reader needs), and they are kept even when a key is full. Open records also
have totals per peer: at most `max_per_signer` per signer (its lowest rounds go first) and
`max_open_bytes` in all (the oldest stored go first), so fresh keys cannot grow a peer's memory.
A kind without a row is refused: a new kind gets a row before any peer stores it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from protocol.errors import InvalidRecord, ProtocolError
from protocol.signing import SignedMessage

MAX_DHT_VALUE_BYTES = 64 * 1024 - 1
DEFAULT_MAX_TTL = 24 * 3600.0  # longest a record may live: a day of rounds
CLOCK_SKEW = 120.0  # seconds of clock difference between honest peers that we tolerate

Writers = Literal["validators", "anyone"]


@dataclass(frozen=True)
class KindPolicy:
    writers: Writers
    max_value_bytes: int
    max_signers: int = 0  # open signers kept per key (0 for validator-only kinds)


POLICIES: Mapping[str, KindPolicy] = {
    "round_result": KindPolicy("validators", MAX_DHT_VALUE_BYTES),
    "checkpoint": KindPolicy("validators", 2048),
    "rollout_pool": KindPolicy("validators", MAX_DHT_VALUE_BYTES),
    "round_metrics": KindPolicy("validators", MAX_DHT_VALUE_BYTES),
    "head": KindPolicy("validators", 8192),
    "heartbeat": KindPolicy("anyone", 8192, max_signers=256),
    "submission": KindPolicy("anyone", 2048, max_signers=256),
    "rollouts": KindPolicy("anyone", 2048, max_signers=256),
}
"""One row per record kind. A kind not listed is refused by every peer."""


@dataclass(frozen=True)
class RecordRules:
    """The store-time rules of one run, the same on every peer of it."""

    run_id: str
    validators: tuple[str, ...] = ()  # public keys (hex) of the run's validators, in priority order
    max_ttl: float = DEFAULT_MAX_TTL
    policies: Mapping[str, KindPolicy] = field(default_factory=lambda: POLICIES)

    def policy(self, kind: str) -> KindPolicy:
        found = self.policies.get(kind)
        if found is None:
            raise InvalidRecord(f"no storage policy for record kind {kind!r}")
        return found

    def is_validator(self, owner: bytes) -> bool:
        return owner.hex() in self.validators

    def priority(self, owner: bytes) -> int:
        """0 for the first validator, 1 for the next...; len(validators) for anyone else."""
        hexed = owner.hex()
        return self.validators.index(hexed) if hexed in self.validators else len(self.validators)

    def read_order(self, owners: list[bytes], kind: str) -> list[bytes]:
        """The owners of one key's records a reader looks at: the validators first (in priority
        order), then the others by key, at most as many as a peer keeps. Junk cannot push the
        record that matters out of a read."""
        limit = len(self.validators) + self.policy(kind).max_signers
        return sorted(owners, key=lambda owner: (self.priority(owner), owner))[:limit]

    def check_writer(self, signed: SignedMessage) -> None:
        """Refuse a validator-only kind signed by anyone else than the run's validators."""
        policy = self.policy(signed.kind)
        if policy.writers == "validators" and not self.is_validator(signed.sender):
            raise InvalidRecord(f"{signed.kind} records are written by the run's validators only")

    def check_size(self, kind: str, size: int) -> None:
        cap = min(self.policy(kind).max_value_bytes, MAX_DHT_VALUE_BYTES)
        if size > cap:
            raise InvalidRecord(f"{kind} value is {size} bytes, cap is {cap}")

    def check_expiration(self, signed: SignedMessage, expiration: float, now: float) -> None:
        """A record expires exactly when its signer said (`SignedMessage.expires_ms`), within `max_ttl`."""
        if expiration != signed.expires_at:
            raise InvalidRecord(
                f"expiration {expiration} is not the signed one ({signed.expires_at}): records are not re-timed"
            )
        if expiration < now - CLOCK_SKEW:
            raise InvalidRecord(f"record expired at {expiration} (signed without an expiry, or long ago)")
        if expiration > now + self.max_ttl + CLOCK_SKEW:
            raise InvalidRecord(f"expiration {expiration} is more than {self.max_ttl:.0f}s ahead")


@dataclass(frozen=True)
class Admission:
    stored: bool
    reason: str = ""
    evict: tuple[tuple[bytes, bytes], ...] = ()  # (key, owner) records the storage drops first


@dataclass
class _Entry:
    round: int
    size: int
    expires: float


class StoreBudget:
    """The open records one storage keeps (`node/net/dhtprocess.py` on hivemind, `memory.py` in process).

    It indexes every open record it admitted, by key, by signer and in the order they came; the
    storage calls `admit` before keeping a new (key, owner) record, drops what `evict` names, and
    calls `forget` when it drops one itself. Entries that expired are purged when a bound is hit.
    """

    def __init__(
        self,
        rules: RecordRules,
        *,
        max_per_signer: int = 256,
        max_open_bytes: int = 64 << 20,
    ) -> None:
        self.rules, self.max_per_signer, self.max_open_bytes = rules, max_per_signer, max_open_bytes
        self._entries: OrderedDict[tuple[bytes, bytes], _Entry] = OrderedDict()  # oldest stored first
        self._by_key: dict[bytes, set[bytes]] = {}
        self._by_signer: dict[bytes, set[bytes]] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def admit(self, key: bytes, owner: bytes, envelope: bytes, expires: float, now: float | None = None) -> Admission:
        """Whether a record of `owner` under `key` may be kept, and which records go first."""
        try:
            signed = SignedMessage.from_bytes(envelope)
            self.rules.check_writer(signed)
            policy = self.rules.policy(signed.kind)
        except ProtocolError as exc:
            return Admission(False, str(exc))
        if self.rules.is_validator(owner):
            return Admission(True)
        now = time.time() if now is None else now
        if (key, owner) in self._entries:  # the same owner again: the storage keeps the newer one
            self._resize(key, owner, len(envelope), max(expires, self._entries[key, owner].expires))
            return Admission(True)
        at_key = self._by_key.get(key, set())
        if len(at_key) >= policy.max_signers:
            self._purge(now, [(key, o) for o in at_key])
            if len(self._by_key.get(key, set())) >= policy.max_signers:
                return Admission(False, f"{signed.kind} key holds {policy.max_signers} open signers already")
        evict = self._evictions(owner, len(envelope), now)
        self._add(key, owner, _Entry(signed.round, len(envelope), expires))
        return Admission(True, evict=tuple(evict))

    def forget(self, key: bytes, owner: bytes) -> None:
        entry = self._entries.pop((key, owner), None)
        if entry is None:
            return
        self.bytes -= entry.size
        for index, a, b in ((self._by_key, key, owner), (self._by_signer, owner, key)):
            members = index.get(a)
            if members is not None:
                members.discard(b)
                if not members:
                    del index[a]

    def _evictions(self, owner: bytes, size: int, now: float) -> list[tuple[bytes, bytes]]:
        """Make room for `size` more bytes of `owner`: its lowest round past `max_per_signer`, then
        the oldest stored records past `max_open_bytes` (a flood pushes out a flood first)."""
        evict: list[tuple[bytes, bytes]] = []
        mine = self._by_signer.get(owner, set())
        if len(mine) >= self.max_per_signer:
            self._purge(now, [(k, owner) for k in mine])
            mine = self._by_signer.get(owner, set())
            if len(mine) >= self.max_per_signer:  # old rounds matter least
                evict.append((min(mine, key=lambda k: self._entries[k, owner].round), owner))
                self.forget(*evict[-1])
        while self.bytes + size > self.max_open_bytes and self._entries:
            evict.append(next(iter(self._entries)))
            self.forget(*evict[-1])
        return evict

    def _purge(self, now: float, pairs: list[tuple[bytes, bytes]]) -> None:
        for pair in pairs:
            entry = self._entries.get(pair)
            if entry is not None and entry.expires <= now:
                self.forget(*pair)

    def _add(self, key: bytes, owner: bytes, entry: _Entry) -> None:
        self._entries[key, owner] = entry
        self._by_key.setdefault(key, set()).add(owner)
        self._by_signer.setdefault(owner, set()).add(key)
        self.bytes += entry.size

    def _resize(self, key: bytes, owner: bytes, size: int, expires: float) -> None:
        entry = self._entries[key, owner]
        self.bytes += size - entry.size
        entry.size, entry.expires = size, expires
