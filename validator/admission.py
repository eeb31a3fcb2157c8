"""Admission: which signed headers of a round the validator takes, decided before any body is read.

    admission = Admission(rules, established, secret)
    verdict = admission.offer(sender, payload_size)   # a header arrived: seated, or refused with a reason
    refusal = admission.arrive(sender)                # its body arrived: kept, or why not any more
    admission.reject(sender, reason)                  # the body arrived and is not a payload: seat freed
    unseated = admission.expire()                     # seats whose body is overdue, freed with their bytes
    waited = admission.awaited(announced)             # of the keys announced for the round, those to wait for

Every check a header passes (signature, run, round, sizes) uses public facts, so a thousand fresh
keys pass them as easily as one honest miner. Arrival order must not decide either: the first
`capacity` senders of a round would otherwise fill it, and whoever floods at the opening wins.
Seats go by standing:

- established keys (the validator's persisted history shows standing earned in at least
  `established_rounds` of the last `established_window` rounds: `Validator.established`, an
  `Established` set that carries each key's standing) hold up to `capacity - newcomer_seats` seats.
  When those are full, a key of higher standing (seniority) takes the seat of the lowest one, and at
  equal standing the lower ticket wins: a hundred established keys that offer first do not shut out
  one that has stood longer, and arrival order decides nothing;
- newcomers share the seats established keys leave (never fewer than `newcomer_seats`). Each
  newcomer draws a ticket, a hash of the validator's secret for the round and its key, and the
  seats go to the lowest tickets among every newcomer that offered this round, whatever the order
  they came in (a bottom-k sample: a uniformly random subset). Tickets come in three tiers, each
  below every ticket of the next: keys `earning` standing (earned it in a round of the window, not
  yet in enough to be established: `gauntlet.earning_of`), then keys `waited` (their payload was
  seated and left unexamined in the round before: `Standing.waited`), then fresh keys. A key that
  did the work once keeps a newcomer seat against any flood of fresh keys until it is established.
  Without that, a run that starts under a flood seated each honest newcomer in about one round in
  five, and the two earning rounds establishment needs took most of a run (0.18 of the clean run's
  honest miners aggregated under 640 fresh keys a round in `pulse bench attacks`). A key that sent
  a whole payload and was not examined goes before the keys that are new this round, so a flood of
  fresh keys each round leaves an honest newcomer out of the examinations for one round, not for a
  run of lotteries; a flood that keeps its keys to wait with them gains one round's place for each
  payload it sent, which it then loses when examined. A later newcomer with a lower ticket
  takes the seat of the highest seated one. Tickets cannot be predicted (the secret is the
  validator's) and a retry draws the same ticket, so sending again gains nothing. A flood of fresh
  keys thins every newcomer's chance alike and never takes an established key's seat; an
  established key that arrives when the seats are full unseats the highest-ticket newcomer.

Bytes: every seat reserves its announced payload size against the round's byte budget, so the
payloads the validator holds for one round on disk (received plus being received) stay within
`byte_budget`, however many keys send; only a body already on its way when its seat is given to
another comes on top until it lands and is refused (at most what the stream slots receive at once).
Newcomers that no longer fit are unseated, highest ticket first.

Seats whose body has not arrived within `body_deadline` of the first offer (the time an upload at
`min_body_rate` takes, plus `body_grace_seconds`) are freed with their bytes when another header
needs them or the caller asks (`expire`), with that reason: a header alone holds nothing for long.
A body that arrives and is no payload of the run's codec (`reject`: random bytes, another layout, a
truncation, found without decoding it) frees its seat at once. Either way its sender cannot take a
seat again this round. Without that, 640 fresh keys a round pushing random bytes held all 128 seats
until the round closed and each honest newcomer was seated in about one round in five (0.58 of the
clean run's honest miners aggregated in `pulse bench attacks`' flood-x4).

Who a round waits for is decided the same way. Announcements (open DHT heartbeats) cost nothing
to sign, so `awaited` counts every established key that announced itself but newcomers only up to
the seats they could hold, lowest tickets first; how long those newcomers are waited for is the
round clock's (`node/roles/deadline.py`: outside every quorum, and no longer than the known miners
took again), where counting them all would keep every round open to its deadline.

Memory is O(seats): nothing is kept about a refused header. Every refusal and every unseating
has a reason: refusals go back to the sender on the stream; unseatings (a newcomer displaced,
perhaps after its body arrived) are returned to the caller, which drops the payload and reports it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


class Established(frozenset[str]):
    """The established keys, each with its standing (higher seats first)."""

    standing: Mapping[str, float]

    def __new__(cls, standing: Mapping[str, float]) -> Established:
        keys = super().__new__(cls, standing)
        keys.standing = dict(standing)
        return keys


def newcomer_ticket(
    secret: bytes, sender: str, earning: frozenset[str] = frozenset(), waited: frozenset[str] = frozenset()
) -> int:
    """`sender`'s ticket for a round whose admission secret is `secret`: lower goes first. Keys in
    `earning`, then keys in `waited`, then fresh keys each draw from their own quarter of the range,
    in that order."""
    draw = int.from_bytes(hashlib.sha256(secret + sender.encode()).digest(), "big") >> 2
    tier = 0 if sender in earning else 1 if sender in waited else 2
    return draw | tier << 254


def standing_of(established: frozenset[str], sender: str) -> float:
    """`sender`'s standing among `established` (0 when the set carries none)."""
    return established.standing.get(sender, 0.0) if isinstance(established, Established) else 0.0


@dataclass(frozen=True)
class AdmissionRules:
    capacity: int  # seats per round (`max_submissions`)
    newcomer_seats: int  # seats established keys cannot take
    byte_budget: int  # payload bytes held for one round, received and being received
    body_grace_seconds: float = 120.0  # a seated header's body is overdue after this ...
    min_body_rate: float = float(1 << 20)  # ... plus its size at this many bytes a second

    def body_deadline(self, size: int) -> float:
        """Seconds a seated header's body may take to arrive before its seat is freed."""
        return self.body_grace_seconds + size / self.min_body_rate


@dataclass
class Seat:
    sender: str
    size: int
    ticket: int | None  # None for an established key
    arrived: bool = False
    since: float = 0.0  # clock when it was first seated (a retry keeps it)
    rank: tuple[float, int] = (0.0, 0)  # established seats: (-standing, ticket), lowest keeps its seat

    @property
    def established(self) -> bool:
        return self.ticket is None


@dataclass(frozen=True)
class Verdict:
    """A header's fate: seated when `refusal` is None; `unseated`: (sender, reason) of seats it took."""

    refusal: str | None = None
    unseated: tuple[tuple[str, str], ...] = ()


@dataclass
class Admission:
    """The seats of one round."""

    rules: AdmissionRules
    established: frozenset[str]
    secret: bytes  # the validator's secret for this round: tickets nobody else can compute
    seats: dict[str, Seat] = field(default_factory=dict)
    offered: int = 0  # headers offered this round (counts, for the round's summary)
    refused: int = 0
    unseated: int = 0
    clock: Callable[[], float] = time.monotonic
    barred: dict[str, str] = field(default_factory=dict)  # sender -> why its seat was freed this round
    earning: frozenset[str] = frozenset()  # keys on their way to being established: the lowest tickets
    waited: frozenset[str] = frozenset()  # keys left unexamined last round: tickets below any fresh key's

    def ticket(self, sender: str) -> int:
        return newcomer_ticket(self.secret, sender, self.earning, self.waited)

    def awaited(self, announced: Iterable[str]) -> set[str]:
        """Of the keys that announced themselves for this round, those the round waits for: every
        established one, and as many newcomers as seats could take, lowest tickets first."""
        keys = set(announced)
        ours = {k for k in keys if k in self.established}
        room = max(self.rules.capacity - len(ours), self.rules.newcomer_seats)
        newcomers = sorted(keys - ours, key=self.ticket)[:room]
        return ours | set(newcomers)

    @property
    def held_bytes(self) -> int:
        return sum(s.size for s in self.seats.values())

    def newcomer_room(self) -> int:
        """Seats newcomers may hold now: what established keys leave, never below `newcomer_seats`."""
        taken = sum(1 for s in self.seats.values() if s.established)
        return max(self.rules.capacity - taken, self.rules.newcomer_seats)

    def offer(self, sender: str, size: int) -> Verdict:
        """Seat `sender`'s header announcing `size` payload bytes, or refuse it."""
        self.offered += 1
        expired = self.expire()
        verdict = self._offer(sender, size)
        verdict = Verdict(verdict.refusal, (*expired, *verdict.unseated))
        self.refused += verdict.refusal is not None
        self.unseated += len(verdict.unseated) - len(expired)
        return verdict

    def expire(self) -> tuple[tuple[str, str], ...]:
        """Free every seat whose body is overdue; (sender, reason) of each."""
        now, out = self.clock(), []
        for seat in list(self.seats.values()):
            allowed = self.rules.body_deadline(seat.size)
            if not seat.arrived and now - seat.since > allowed:
                del self.seats[seat.sender]
                self.barred[seat.sender] = "its seat was freed this round: the body did not arrive in time"
                out.append((seat.sender, f"seat freed: its body did not arrive within {allowed:.0f} s"))
        self.unseated += len(out)
        return tuple(out)

    def arrive(self, sender: str) -> str | None:
        """The body of `sender`'s seated header arrived: None to keep it, else why it is refused."""
        seat = self.seats.get(sender)
        if seat is None:
            return "unseated while its body arrived (by a lower newcomer ticket or an established miner)"
        if seat.arrived:
            return "one submission per miner per round"
        seat.arrived = True
        return None

    def reject(self, sender: str, reason: str) -> None:
        """`sender`'s body arrived and is refused for `reason` (it is not a payload of the run's codec):
        its seat and bytes go to others at once, and it takes no seat again this round. Such a body
        costs little to find, but a seat held by it until the round closes is one no honest newcomer
        gets: a flood of junk from fresh keys would otherwise hold every seat."""
        self.seats.pop(sender, None)
        self.barred[sender] = f"its payload was refused this round: {reason}"

    def leave(self, sender: str) -> None:
        """Free `sender`'s seat (its body never came, or it was refused for another reason)."""
        self.seats.pop(sender, None)

    # -- the decision ----------------------------------------------------------------------------

    def _offer(self, sender: str, size: int) -> Verdict:
        old = self.seats.get(sender)
        if old is not None and old.arrived:
            return Verdict("one submission per miner per round")
        if sender in self.barred:
            return Verdict(self.barred[sender])
        if size > self.rules.byte_budget:
            return Verdict(f"payload of {size} bytes exceeds the round's budget of {self.rules.byte_budget}")
        if old is not None:  # the same key again before its body came (a retry): same seat, new size
            del self.seats[sender]
            verdict = self._place(sender, size, old.ticket, unseat=0, since=old.since, rank=old.rank)
            if verdict.refusal is not None:
                self.seats[sender] = old
            return verdict
        if sender in self.established:
            return self._offer_established(sender, size)
        ticket = self.ticket(sender)
        newcomers = [s for s in self.seats.values() if not s.established]
        room = self.newcomer_room()
        if len(newcomers) < room:
            return self._place(sender, size, ticket, unseat=0)
        highest = max(s.ticket or 0 for s in newcomers)
        if ticket > highest:
            return Verdict(f"not drawn: {room} newcomer seats held by lower tickets ({self.offered} offers this round)")
        return self._place(sender, size, ticket, unseat=1)

    def _offer_established(self, sender: str, size: int) -> Verdict:
        """An established key: a free established seat, else the seat of the lowest-standing one below it."""
        ours = [s for s in self.seats.values() if s.established]
        rank = (-standing_of(self.established, sender), self.ticket(sender))
        unseat = max(0, len(self.seats) + 1 - self.rules.capacity)
        if len(ours) < self.rules.capacity - self.rules.newcomer_seats:
            return self._place(sender, size, None, unseat=unseat, rank=rank)
        lowest = max(ours, key=lambda s: s.rank)
        if lowest.rank < rank:
            return Verdict(f"round is full: {len(ours)} established miners of higher standing seated")
        del self.seats[lowest.sender]
        verdict = self._place(sender, size, None, unseat=0, rank=rank)
        if verdict.refusal is not None:
            self.seats[lowest.sender] = lowest
            return verdict
        return Verdict(
            None, ((lowest.sender, "unseated by an established miner of higher standing"), *verdict.unseated)
        )

    def _place(
        self,
        sender: str,
        size: int,
        ticket: int | None,
        *,
        unseat: int,
        since: float | None = None,
        rank: tuple[float, int] = (0.0, 0),
    ) -> Verdict:
        """Seat `sender`, unseating `unseat` newcomers (highest ticket first, and only tickets above
        `ticket` for a newcomer) and more while the bytes do not fit; refused if they cannot."""
        movable = sorted(
            (s for s in self.seats.values() if not s.established and (ticket is None or (s.ticket or 0) > ticket)),
            key=lambda s: -(s.ticket or 0),
        )
        held, out = self.held_bytes, list[Seat]()
        for seat in movable:
            if len(out) >= unseat and held + size <= self.rules.byte_budget:
                break
            out.append(seat)
            held -= seat.size
        if len(out) < unseat or held + size > self.rules.byte_budget:
            if ticket is None:
                return Verdict(f"payload of {size} bytes does not fit the round's remaining budget")
            return Verdict(f"not drawn: the budget newcomers may hold is taken by lower tickets ({size} bytes)")
        why = "unseated by an established miner" if ticket is None else "unseated by a newcomer with a lower ticket"
        for seat in out:
            del self.seats[seat.sender]
        self.seats[sender] = Seat(sender, size, ticket, since=self.clock() if since is None else since, rank=rank)
        return Verdict(None, tuple((s.sender, why) for s in out))
