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
- `max_signers`: how many open signers (not validators) one key keeps, and a reader looks at
  (`read_order`: those it knows to have standing first, the rest in an order only it knows), so a
  `get` returns a bounded answer; once full, a new signer replaces one drawn at random among those without
  standing (keys a validator's round result aggregated, or whose rollouts its pool took, lately),
  never a key's first comers for good;
- `open_share`: the share of a peer's `max_open_bytes` the open kind may fill, so a flood of one
  kind (heartbeats) cannot evict another (rollout announcements).

Records of the run's validators never count against a budget (there are at most 16 keys, and
they are the ones a reader needs), and they are kept even when a key is full; they also tell a
peer the run's head (the highest round they wrote) and who has standing. A storage is asked to
keep only the records whose keys lie near it, so its own node also tells it the head of every
validator record it reads (`learn_head`). An open record for a
round beyond the head + `ROUND_WINDOW` (round 0 + `ROUND_WINDOW` while no head is known: every run
starts there), or expiring more than `OPEN_MAX_TTL` ahead, is refused.
Open records have totals per peer: at most `max_per_signer` per signer (its lowest rounds go
first) and the kind's quota, past which the records of the rounds farthest from the head go first
(future rounds before past ones; a random one of the round, signers without standing first), so
a flood for rounds nobody needs evicts itself before a record of the current round.
A kind without a row is refused: a new kind gets a row before any peer stores it.
"""

from __future__ import annotations

import bisect
import hashlib
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from protocol.errors import InvalidRecord, ProtocolError
from protocol.signing import SignedMessage, open_parsed

MAX_DHT_VALUE_BYTES = 64 * 1024 - 1
DEFAULT_MAX_TTL = 24 * 3600.0  # longest a record may live: a day of rounds
CLOCK_SKEW = 120.0  # seconds of clock difference between honest peers that we tolerate
OPEN_MAX_TTL = 6 * 3600.0  # longest an open record may live (its round is long over by then)
ROUND_WINDOW = 4  # open records of rounds beyond the head plus this are refused
STANDING_ROUNDS = 64  # a key aggregated within this many rounds of the head has standing
MAX_STANDING_KEYS = 4096

Writers = Literal["validators", "anyone"]


@dataclass(frozen=True)
class KindPolicy:
    writers: Writers
    max_value_bytes: int
    max_signers: int = 0  # open signers kept per key (0 for validator-only kinds)
    open_share: float = 0.0  # of a storage's `max_open_bytes`, what this open kind may fill


POLICIES: Mapping[str, KindPolicy] = {
    "round_result": KindPolicy("validators", MAX_DHT_VALUE_BYTES),
    "checkpoint": KindPolicy("validators", 2048),
    "rollout_pool": KindPolicy("validators", MAX_DHT_VALUE_BYTES),
    "round_metrics": KindPolicy("validators", MAX_DHT_VALUE_BYTES),
    "head": KindPolicy("validators", 8192),
    "heartbeat": KindPolicy("anyone", 8192, max_signers=256, open_share=0.5),
    "submission": KindPolicy("anyone", 2048, max_signers=256, open_share=0.25),
    "rollouts": KindPolicy("anyone", 2048, max_signers=256, open_share=0.25),
}
"""One row per record kind. A kind not listed is refused by every peer."""


def capped_ttl(kind: str, ttl: float) -> float:
    """The TTL a record of `kind` is signed with: an open kind's at most `OPEN_MAX_TTL` (peers refuse longer)."""
    policy = POLICIES.get(kind)
    return min(ttl, OPEN_MAX_TTL) if policy is not None and policy.writers == "anyone" else ttl


def no_standing(_: bytes) -> bool:
    """A reader that knows of no key with standing (`RecordRules.read_order`'s default)."""
    return False


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

    def read_order(
        self, owners: list[bytes], kind: str, *, salt: bytes = b"", preferred: Callable[[bytes], bool] = no_standing
    ) -> list[bytes]:
        """The owners of one key's records a reader looks at, at most as many as a peer keeps: the
        validators first (in priority order), then the keys the reader holds `preferred` (those with
        standing), then the others in the order of a hash of the reader's secret `salt` and the key.
        A read merges the records of several storages, so it can find more signers than it looks at:
        junk cannot push the record that matters out of it, and no key can be ground to come first
        (in key order, a flood of keys ground to start with zero bytes took every place)."""
        limit = len(self.validators) + self.policy(kind).max_signers

        def rank(owner: bytes) -> tuple[int, bool, bytes]:
            return self.priority(owner), not preferred(owner), hashlib.sha256(salt + owner).digest()

        return sorted(owners, key=rank)[:limit]

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


Pair = tuple[bytes, bytes]  # (key, owner)


@dataclass
class _Entry:
    kind: str
    round: int
    size: int
    expires: float


class _Bag:
    """A set with O(1) add, remove and uniform random choice (eviction must not be predictable)."""

    def __init__(self) -> None:
        self._items: list[Pair] = []
        self._index: dict[Pair, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Pair]:
        return iter(list(self._items))

    def add(self, item: Pair) -> None:
        if item not in self._index:
            self._index[item] = len(self._items)
            self._items.append(item)

    def remove(self, item: Pair) -> None:
        at = self._index.pop(item, None)
        if at is None:
            return
        last = self._items.pop()
        if at < len(self._items):
            self._items[at] = last
            self._index[last] = at

    def sample(self, rng: random.Random) -> Pair:
        return self._items[rng.randrange(len(self._items))]


class StoreBudget:
    """The open records one storage keeps (`node/net/dhtprocess.py` on hivemind, `memory.py` in process).

    It indexes every open record it admitted, by key, by signer, by kind and round; the storage
    calls `admit` before keeping a new (key, owner) record, drops what `evict` names, and calls
    `forget` when it drops one itself. Entries that expired are purged when a bound is hit. What
    it learns of the run comes from the validators' records it is asked to store: the head (the
    highest round they wrote) and the keys with standing (the miners their round results aggregated,
    the inference workers their rollout pools took).
    """

    def __init__(
        self,
        rules: RecordRules,
        *,
        max_per_signer: int = 256,
        max_open_bytes: int = 64 << 20,
        rng: random.Random | None = None,
    ) -> None:
        self.rules, self.max_per_signer, self.max_open_bytes = rules, max_per_signer, max_open_bytes
        self.rng = rng or random.Random()
        self._entries: dict[Pair, _Entry] = {}
        self._by_key: dict[bytes, set[bytes]] = {}
        self._by_signer: dict[bytes, set[bytes]] = {}
        self._rounds: dict[str, dict[int, _Bag]] = {}  # kind -> round -> its records
        self._sorted: dict[str, list[int]] = {}  # kind -> the rounds it holds, ascending
        self._kind_bytes: dict[str, int] = {}
        self.head: int | None = None  # the highest round of a validator record seen
        self.standing: OrderedDict[bytes, int] = OrderedDict()  # owner -> round a validator aggregated it
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
            self._learn(signed)
            return Admission(True)
        now = time.time() if now is None else now
        if (key, owner) in self._entries:  # the same owner again: the storage keeps the newer one
            self._resize(key, owner, len(envelope), max(expires, self._entries[key, owner].expires))
            return Admission(True)
        refusal = self._refusal(signed, expires, now)
        if refusal:
            return Admission(False, refusal)
        evict: list[Pair] = []
        if len(self._by_key.get(key, ())) >= policy.max_signers:
            self._purge(now, [(key, o) for o in list(self._by_key.get(key, ()))])
        if len(self._by_key.get(key, ())) >= policy.max_signers:
            victim = self._displaced(key)
            if victim is None:
                return Admission(False, f"{signed.kind} key holds {policy.max_signers} signers with standing")
            evict.append(victim)
        evict += self._evictions(owner, signed.kind, len(envelope), now)
        self._add(key, owner, _Entry(signed.kind, signed.round, len(envelope), expires))
        return Admission(True, evict=tuple(evict))

    def forget(self, key: bytes, owner: bytes) -> None:
        entry = self._entries.pop((key, owner), None)
        if entry is None:
            return
        self.bytes -= entry.size
        self._kind_bytes[entry.kind] -= entry.size
        for index, a, b in ((self._by_key, key, owner), (self._by_signer, owner, key)):
            members = index.get(a)
            if members is not None:
                members.discard(b)
                if not members:
                    del index[a]
        bag = self._rounds[entry.kind][entry.round]
        bag.remove((key, owner))
        if not bag:
            del self._rounds[entry.kind][entry.round]
            rounds = self._sorted[entry.kind]
            del rounds[bisect.bisect_left(rounds, entry.round)]

    def quota(self, kind: str) -> int:
        """The bytes of open records of `kind` this storage keeps: its share of `max_open_bytes`."""
        return int(self.max_open_bytes * self.rules.policy(kind).open_share)

    def learn_head(self, round_: int) -> None:
        """The run's validators wrote round `round_`: this peer's own node read and verified their record
        (a storage is asked to store only the records whose keys are near it, so it may hold none)."""
        self.head = round_ if self.head is None else max(self.head, round_)

    def _learn(self, signed: SignedMessage) -> None:
        """The head and the keys with standing, from a record of one of the run's validators."""
        if signed.kind == "head":
            return  # stored at one fixed round, not the round the run is at
        self.head = signed.round if self.head is None else max(self.head, signed.round)
        if signed.kind not in ("round_result", "rollout_pool"):
            return
        try:
            message = open_parsed(signed, run_id=self.rules.run_id).message
        except ProtocolError:
            return
        # a miner the round aggregated, an inference worker whose batch the pool took: work done
        miners = [a.sender for a in getattr(message, "selected", ())]
        for key in miners + [e.worker for e in getattr(message, "entries", ())]:
            owner = bytes.fromhex(key)
            self.standing.pop(owner, None)
            self.standing[owner] = signed.round
        while len(self.standing) > MAX_STANDING_KEYS:
            self.standing.popitem(last=False)

    def _refusal(self, signed: SignedMessage, expires: float, now: float) -> str:
        """Why an open record is refused before anything is evicted for it ("" if it is not)."""
        # a storage that has seen no validator record yet takes the head to be the run's start:
        # every run begins at round 0, and a flood of far rounds stored then would hold those keys
        # for the hours until the run got there; its own node reads the head as soon as it joins
        # (`learn_head`), so an honest record of a later round is refused only until then
        head = 0 if self.head is None else self.head
        if signed.round > head + ROUND_WINDOW:
            known = f"the head ({self.head})" if self.head is not None else "the run's start (no head seen yet)"
            return f"{signed.kind} for round {signed.round}, beyond {known} + {ROUND_WINDOW}"
        if expires > now + OPEN_MAX_TTL + CLOCK_SKEW:
            return f"{signed.kind} expires more than {OPEN_MAX_TTL:.0f}s ahead"
        return ""

    def _has_standing(self, owner: bytes) -> bool:
        aggregated = self.standing.get(owner)
        return aggregated is not None and (self.head is None or aggregated >= self.head - STANDING_ROUNDS)

    def _displaced(self, key: bytes) -> Pair | None:
        """A full key: the record a new signer replaces, drawn at random among the signers without
        standing (so a fresh signer can always displace a sybil's, and no first comers keep the key);
        None if every signer there has standing."""
        open_owners = sorted(o for o in self._by_key.get(key, ()) if not self._has_standing(o))
        if not open_owners:
            return None
        victim = (key, open_owners[self.rng.randrange(len(open_owners))])
        self.forget(*victim)
        return victim

    def _evictions(self, owner: bytes, kind: str, size: int, now: float) -> list[Pair]:
        """Make room for `size` more bytes of `owner`'s `kind`: its lowest round past
        `max_per_signer`, then, past the kind's quota, records of the rounds farthest from the head
        (future rounds first), a random one of the round, signers without standing first."""
        evict: list[Pair] = []
        mine = self._by_signer.get(owner, set())
        if len(mine) >= self.max_per_signer:
            self._purge(now, [(k, owner) for k in mine])
            mine = self._by_signer.get(owner, set())
            if len(mine) >= self.max_per_signer:  # old rounds matter least
                evict.append((min(mine, key=lambda k: self._entries[k, owner].round), owner))
                self.forget(*evict[-1])
        while self._kind_bytes.get(kind, 0) + size > self.quota(kind) and self._sorted.get(kind):
            evict.append(self._far_victim(kind))
            self.forget(*evict[-1])
        return evict

    def _far_victim(self, kind: str) -> Pair:
        rounds = self._sorted[kind]
        low, high = rounds[0], rounds[-1]
        if self.head is None or high > self.head + ROUND_WINDOW or high - self.head >= self.head - low:
            far = high  # no head known: a flood of future rounds is the one to fear
        else:
            far = low
        bag = self._rounds[kind][far]
        draws = [bag.sample(self.rng) for _ in range(min(len(bag), 4))]
        return next((d for d in draws if not self._has_standing(d[1])), draws[0])

    def _purge(self, now: float, pairs: list[Pair]) -> None:
        for pair in pairs:
            entry = self._entries.get(pair)
            if entry is not None and entry.expires <= now:
                self.forget(*pair)

    def _add(self, key: bytes, owner: bytes, entry: _Entry) -> None:
        self._entries[key, owner] = entry
        self._by_key.setdefault(key, set()).add(owner)
        self._by_signer.setdefault(owner, set()).add(key)
        by_round = self._rounds.setdefault(entry.kind, {})
        if entry.round not in by_round:
            by_round[entry.round] = _Bag()
            bisect.insort(self._sorted.setdefault(entry.kind, []), entry.round)
        by_round[entry.round].add((key, owner))
        self.bytes += entry.size
        self._kind_bytes[entry.kind] = self._kind_bytes.get(entry.kind, 0) + entry.size

    def _resize(self, key: bytes, owner: bytes, size: int, expires: float) -> None:
        entry = self._entries[key, owner]
        self.bytes += size - entry.size
        self._kind_bytes[entry.kind] += size - entry.size
        entry.size, entry.expires = size, expires
