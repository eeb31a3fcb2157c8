"""Admission: seats by standing, newcomers drawn by secret ticket, a byte budget, a reason for every refusal."""

from __future__ import annotations

import hashlib
import random

from validator.admission import Admission, AdmissionRules, Established
from validator.config import GauntletConfig
from validator.core import earning_in, established_in
from validator.state import Book

SECRET = hashlib.sha256(b"round secret").digest()


def keys(label: str, n: int) -> list[str]:
    return [hashlib.sha256(f"{label}/{i}".encode()).hexdigest() for i in range(n)]


def admission(capacity: int = 8, newcomer_seats: int = 2, budget: int = 10_000, est: tuple[str, ...] = ()) -> Admission:
    return Admission(AdmissionRules(capacity, newcomer_seats, budget), frozenset(est), SECRET)


def offer_all(a: Admission, senders: list[str], size: int = 100) -> dict[str, str | None]:
    """Each sender offers once; its final fate (None = seated at the end)."""
    fate: dict[str, str | None] = {}
    for s in senders:
        verdict = a.offer(s, size)
        fate[s] = verdict.refusal
        for gone, reason in verdict.unseated:
            fate[gone] = reason
    return fate


def test_newcomers_are_drawn_by_ticket_whatever_their_arrival_order() -> None:
    flood = keys("newcomer", 40)
    expected = set(sorted(flood, key=admission().ticket)[:8])  # the 8 lowest tickets
    for seed in range(5):
        order = random.Random(seed).sample(flood, len(flood))
        a = admission()
        fate = offer_all(a, order)
        assert set(a.seats) == expected
        assert all(fate[s] is None for s in expected)
        assert all(fate[s] for s in set(flood) - expected)  # every other one has a reason
        refusals = {fate[s] for s in set(flood) - expected}
        assert all(r is not None and ("not drawn" in r or "lower ticket" in r) for r in refusals)


def test_another_round_draws_other_newcomers_and_a_retry_draws_the_same_ticket() -> None:
    flood = keys("newcomer", 40)
    a = admission()
    offer_all(a, flood)
    other = Admission(a.rules, frozenset(), hashlib.sha256(b"next round").digest())
    offer_all(other, flood)
    assert set(other.seats) != set(a.seats)
    refused = next(s for s in flood if s not in a.seats)
    again = [a.offer(refused, 100).refusal for _ in range(20)]
    assert all(r is not None and "not drawn" in r for r in again) and refused not in a.seats


def test_established_miners_are_seated_first_and_unseat_newcomers() -> None:
    est = keys("established", 6)
    a = admission(est=tuple(est))
    fate = offer_all(a, keys("newcomer", 40))  # the flood comes first and fills every seat
    assert len(a.seats) == 8
    before = a.unseated
    fate |= offer_all(a, est)
    assert all(fate[s] is None for s in est) and set(est) <= set(a.seats)
    assert len(a.seats) == 8 and sum(not s.established for s in a.seats.values()) == 2
    unseated = [r for s, r in fate.items() if r and "established" in r]
    assert len(unseated) == 6 and a.unseated - before == 6


def test_newcomers_always_keep_their_reserved_seats() -> None:
    est = keys("established", 10)
    a = admission(est=tuple(est))
    fate = offer_all(a, est)
    assert sum(r is None for r in fate.values()) == 6  # capacity 8 - 2 newcomer seats
    assert set(a.seats) == set(sorted(est, key=a.ticket)[:6])  # equal standing: the lowest tickets, not the first
    assert all("round is full" in r or "higher standing" in r for r in fate.values() if r)
    offer_all(a, keys("newcomer", 20))
    assert sum(not s.established for s in a.seats.values()) == 2


def test_a_round_waits_for_every_established_key_and_for_newcomers_only_as_many_as_seats() -> None:
    est, newcomers = keys("established", 5), keys("newcomer", 300)
    a = admission(est=tuple(est))
    waited = a.awaited([*est[:4], *newcomers])  # a flood of announcements, and four established keys
    assert set(est[:4]) <= waited and est[4] not in waited  # who did not announce is not waited for
    drawn = waited - set(est)
    assert drawn == set(sorted(newcomers, key=a.ticket)[:4])  # the seats left (8 - 4), by ticket
    assert a.awaited(newcomers[:1]) == set(newcomers[:1])
    crowded = admission(est=tuple(keys("established", 10)))
    assert len(crowded.awaited([*keys("established", 10), *newcomers]) - set(keys("established", 10))) == 2


def test_the_byte_budget_bounds_what_is_held_and_established_bytes_come_first() -> None:
    est = keys("established", 2)
    a = admission(capacity=16, budget=1000, est=tuple(est))
    fate = offer_all(a, keys("newcomer", 30), size=300)  # 3 fit the budget
    assert a.held_bytes <= 1000 and len(a.seats) == 3
    fate |= offer_all(a, est, size=400)
    assert all(fate[s] is None for s in est)
    assert a.held_bytes <= 1000 and sum(not s.established for s in a.seats.values()) == 0
    big = a.offer(keys("newcomer", 31)[-1], 2000)
    assert big.refusal is not None and "exceeds the round's budget" in big.refusal


def test_one_body_per_sender_and_an_unseated_body_is_refused_on_arrival() -> None:
    a = admission(capacity=2, newcomer_seats=2)
    lower, low, high = sorted(keys("newcomer", 3), key=a.ticket)
    assert a.offer(high, 10).refusal is None and a.offer(low, 10).refusal is None
    assert a.arrive(low) is None
    assert a.offer(low, 10).refusal == "one submission per miner per round"
    assert a.arrive(low) == "one submission per miner per round"
    assert a.offer(high, 20).refusal is None and a.seats[high].size == 20  # a retry before its body: same seat
    verdict = a.offer(lower, 10)  # `high`'s body is still on its way when it loses its seat
    assert verdict.refusal is None and [s for s, _ in verdict.unseated] == [high]
    refusal = a.arrive(high)
    assert refusal is not None and "unseated" in refusal


def test_established_seats_go_by_standing_not_by_who_offers_first() -> None:
    """112 established sybils (standing 2: they earned it lately) offer first and take every established
    seat of a 128-seat round; an honest miner that has stood for 30 rounds still gets one, and arrival
    order does not decide among equals. (Established seats used to be first come: it was refused
    "round is full".)"""
    sybils = keys("sybil", 112)
    honest = keys("honest", 1)[0]
    standing = dict.fromkeys(sybils, 2.0) | {honest: 30.0}
    a = Admission(AdmissionRules(128, 16, 10**9), Established(standing), SECRET)
    fate = offer_all(a, sybils)
    assert all(r is None for r in fate.values()) and len(a.seats) == 112
    verdict = a.offer(honest, 100)
    assert verdict.refusal is None and honest in a.seats
    assert len(verdict.unseated) == 1 and "higher standing" in verdict.unseated[0][1]
    first = Admission(a.rules, Established(standing), SECRET)  # the honest miner came first: it stays
    fate = offer_all(first, [honest, *sybils])
    assert honest in first.seats and fate[honest] is None
    assert set(first.seats) - {honest} == set(sorted(sybils, key=first.ticket)[:111])  # equals: by ticket


def test_a_seat_whose_body_never_comes_is_freed_with_its_bytes() -> None:
    """A header-only sender holds its seat and its bytes only until its body is overdue; then the next
    header frees it, with the reason, and the sender cannot take a seat again this round. A body that
    arrived in time keeps its seat however long the round lasts."""
    now = [0.0]
    rules = AdmissionRules(2, 2, 1000, body_grace_seconds=10.0, min_body_rate=100.0)
    a = Admission(rules, frozenset(), SECRET, clock=lambda: now[0])
    silent, honest, late = sorted(keys("newcomer", 3), key=a.ticket)
    assert a.offer(silent, 500).refusal is None and a.offer(honest, 500).refusal is None
    assert a.arrive(honest) is None
    refused = a.offer(late, 500)
    assert refused.refusal is not None and "not drawn" in refused.refusal  # the seats and bytes are held
    now[0] = 14.0  # 10 s + 500 bytes at 100 B/s = 15 s: not yet overdue
    assert a.offer(late, 500).refusal is not None
    now[0] = 15.5
    verdict = a.offer(late, 500)
    assert verdict.refusal is None and set(a.seats) == {honest, late}
    assert verdict.unseated == ((silent, "seat freed: its body did not arrive within 15 s"),)
    assert a.held_bytes == 1000 and a.unseated == 1
    again = a.offer(silent, 500).refusal
    assert again is not None and "did not arrive in time" in again
    assert a.arrive(silent) is not None  # a body that comes after all is refused
    assert a.arrive(late) is None
    now[0] = 1000.0
    assert a.expire() == () and set(a.seats) == {honest, late}


def test_a_body_that_is_no_payload_frees_its_seat_and_bytes_at_once() -> None:
    """Junk from the lowest tickets holds the seats only until it lands: each rejected body frees its
    seat and bytes to the next newcomer, whatever its ticket, and its sender is not seated again."""
    a = admission(capacity=2, newcomer_seats=2, budget=200)
    junk = keys("junk", 2)
    worst_junk = max(a.ticket(k) for k in junk)
    honest = [k for k in keys("honest", 50) if a.ticket(k) > worst_junk][:2]  # drawn after the junk
    assert all(a.offer(k, 100).refusal is None for k in junk)
    assert all("not drawn" in str(a.offer(k, 100).refusal) for k in honest)  # the junk holds both
    for k in junk:
        assert a.arrive(k) is None
        a.reject(k, "undecodable: UnknownVersion: not a sparseloco payload (bad magic)")
    assert a.seats == {} and a.held_bytes == 0
    assert all(a.offer(k, 100).refusal is None for k in honest)
    again = a.offer(junk[0], 100).refusal
    assert again is not None and "its payload was refused this round: undecodable" in again


def test_a_key_that_earned_standing_once_keeps_a_newcomer_seat_against_any_flood() -> None:
    """Established takes two earning rounds; under a flood of fresh keys a newcomer was seated in
    about one round in five, so the second took most of a run. A key that earned once now draws its
    ticket below every fresh key's, in every round, whatever the order the flood comes in."""
    earner, flood = keys("earner", 1)[0], keys("fresh", 500)
    for seed in range(5):
        secret = hashlib.sha256(f"round {seed}".encode()).digest()
        a = Admission(AdmissionRules(8, 2, 10_000), frozenset(), secret, earning=frozenset({earner}))
        order = random.Random(seed).sample([*flood, earner], len(flood) + 1)
        fate = offer_all(a, order)
        assert fate[earner] is None and earner in a.seats and len(a.seats) == 8
        assert earner in a.awaited([*flood, earner])  # and a round waits for it before any fresh key
        plain = Admission(AdmissionRules(8, 2, 10_000), frozenset(), secret)  # the same key, fresh
        assert plain.ticket(earner) > a.ticket(earner) and plain.ticket(flood[0]) == a.ticket(flood[0])


def test_the_earning_keys_come_from_the_book_and_leave_it_once_established() -> None:
    """Every intake (the active validator's and a standby's) reads the same keys from the book."""
    cfg = GauntletConfig()
    once, twice, long_ago = keys("miner", 3)
    gained = {once: [9], twice: [8, 9], long_ago: [9 - cfg.established_window - 1]}
    book = Book(round=10, outer_steps=10, ratings={}, indicators={}, seen=[], gained=gained, states=["0" * 64])
    assert earning_in(cfg, book) == {once} and set(established_in(cfg, book)) == {twice}
