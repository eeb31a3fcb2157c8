"""How much of a round newcomers may spend: which of their payloads are decoded and evaluated.

    budget = NewcomerBudget(established, earning, evaluations, secret=round_secret.key("admission"))
    unexamined = examine_in_passes(payloads, senders_of, budget, examine)

A seat costs a payload's bytes (admission.py bounds them); examining it costs its decode and its
forward passes, seconds each at 0.5B. Up to 128 seats go to newcomers when few established keys
send, so a flood of fresh keys sending valid noise at the median norm (no work: `quietnoise`) would
make every round decode and evaluate all of them. Here every payload an established key sent is
examined, and newcomers' payloads until `evaluations` of them were decoded, lowest admission
ticket first (keys earning standing, then keys left unexamined the round before, then fresh keys,
as for seats). A payload that fails before
its whole body is read (random bytes, another layout, a truncation) costs little and does not
count, so a flood of junk cannot spend the budget and shut the honest newcomers out. One that fails
later counts: its streams were being decoded, so it cost about what a decode costs (a valid
payload with its last byte changed decodes whole and then fails its checks); if it did not count, a
flood of those would make every round decode every seat. The rest are rejected unexamined, with
nothing held against their keys.

Payloads are examined in passes, each in arrival order: the established ones and the first
`evaluations` newcomers, then as many more newcomers as failed cheaply, and so on. A round with
no more newcomer payloads than `evaluations` is one pass in arrival order, as without a budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from validator.admission import newcomer_ticket

T = TypeVar("T")
NOT_EXAMINED = "not examined: "  # how the reason of a payload left unexamined begins


@dataclass(frozen=True)
class NewcomerBudget:
    established: frozenset[str]
    earning: frozenset[str]  # keys on their way to being established: the lowest tickets
    evaluations: int  # newcomer payloads decoded whole per round, at most
    secret: bytes = b""  # the round's admission secret (`RoundSecret.key("admission")`): the tickets
    waited: frozenset[str] = frozenset()  # keys left unexamined last round: tickets before fresh keys'

    def vouched(self, senders: Sequence[str]) -> bool:
        """Whether an established key is among `senders` (the keys that sent one payload)."""
        return any(s in self.established for s in senders)

    def ticket(self, senders: Sequence[str]) -> int | None:
        """The ticket of a payload sent by `senders`: None when one of them is established (always
        examined), else their lowest."""
        if self.vouched(senders):
            return None
        return min(newcomer_ticket(self.secret, s, self.earning, self.waited) for s in senders)


def examine_in_passes(
    items: Sequence[T],
    senders_of: Callable[[T], Sequence[str]],
    budget: NewcomerBudget | None,
    examine: Callable[[list[T]], Sequence[bool]],
) -> list[T]:
    """Run `examine` (item -> whether its decode ran: whole, or failing late) over `items` in passes
    (see above); the items left unexamined, lowest ticket first. Without a budget, one pass over
    every item."""
    if budget is None:
        examine(list(items))
        return []
    arrival = {id(item): i for i, item in enumerate(items)}
    newcomers = {id(item): t for item in items if (t := budget.ticket(senders_of(item))) is not None}
    queue = sorted((item for item in items if id(item) in newcomers), key=lambda item: newcomers[id(item)])
    room = budget.evaluations
    todo = [item for item in items if id(item) not in newcomers] + queue[:room]
    queue = queue[room:]
    while todo:
        todo.sort(key=lambda item: arrival[id(item)])
        ran = examine(todo)
        room -= sum(1 for item, costly in zip(todo, ran, strict=True) if costly and id(item) in newcomers)
        todo, queue = queue[: max(room, 0)], queue[max(room, 0) :]
    return queue
