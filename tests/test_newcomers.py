"""A flood of fresh keys sending valid noise cannot make a round decode and evaluate all its seats:
newcomers' payloads are examined only up to `newcomer_evaluations` decoded ones, lowest admission
ticket first. Payloads that fail before their body is read do not count (a junk flood cannot spend
the budget); payloads that fail only after a decode's work count, as noise does."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from node.bench import newcomerflood
from node.bench.arena import Arena, RoundRecord
from node.swarm.fakeminers import FreshNoise, Miner, RoundView, identity_for
from tests.fakeswarm import CountingEvaluator, make_swarm
from validator.admission import newcomer_ticket
from validator.core import RoundReport
from validator.intake import Submission
from validator.newcomers import NOT_EXAMINED, NewcomerBudget, examine_in_passes
from validator.scoring import RoundSecret

BUDGET = 4
NOISE, JUNK, LATE = 10, 8, 6


class Junk(Miner):
    kind = "junk"

    def submit(self, view: RoundView) -> Submission | None:
        return self.package(view.round, view.state_hash, b"\x00junk" + bytes.fromhex(self.key[:16]))


class LateJunk(FreshNoise):
    """Valid noise with its last byte changed: it reads whole, decodes, then fails its checks."""

    kind = "latejunk"

    def submit(self, view: RoundView) -> Submission | None:
        noise = super().submit(view)
        assert noise is not None
        late = noise.payload[:-1] + bytes([noise.payload[-1] ^ 0xFF])
        return self.package(view.round, view.state_hash, late)


@dataclass(frozen=True)
class Flooded:
    arena: Arena
    record: RoundRecord  # the flooded round
    honest: list[Miner]
    loads: int  # updates the validator loaded in that round
    alone: RoundReport  # the same round judged from the honest miners' submissions alone
    norm: float  # the median norm the noise was sent at


@pytest.fixture(scope="module")
def flooded(tmp_path_factory: pytest.TempPathFactory) -> Flooded:
    """Three honest miners until they are established, then a round with a fresh honest miner, 10 keys
    of valid noise at the median norm, 8 keys of junk and 6 of junk that fails late, with a budget of
    4 newcomer examinations; and that round again, from a copy of the validator's folder, without
    the newcomers."""
    swarm = make_swarm(newcomer_evaluations=BUDGET)
    folder = tmp_path_factory.mktemp("flooded")
    honest = swarm.honest(3)
    arena = Arena(swarm.validator(folder / "v"), honest)
    newcomerflood.establish(arena, {m.key for m in honest}, max_rounds=8)
    norm = arena.records[-1].report.median_norm
    newcomer = Miner(swarm.setup, identity_for("newcomers/honest"))
    noise = [FreshNoise(swarm.setup, identity_for(f"newcomers/noise/{i}"), norm) for i in range(NOISE)]
    junk = [Junk(swarm.setup, identity_for(f"newcomers/junk/{i}")) for i in range(JUNK)]
    late = [LateJunk(swarm.setup, identity_for(f"newcomers/late/{i}"), norm) for i in range(LATE)]
    arena.miners = [*honest, newcomer, *noise, *junk, *late]
    shutil.copytree(folder / "v", folder / "twin")
    subs, kinds, senders = arena.submissions()
    counting = CountingEvaluator(arena.validator.evaluator)
    arena.validator.evaluator = counting
    report = arena.validator.run_round(subs)
    record = RoundRecord(report, kinds, senders, arena.validator.weights)
    ours = {m.key for m in honest}
    alone = swarm.reopen(folder / "twin").run_round([s for s, k in zip(subs, senders, strict=True) if k in ours])
    return Flooded(arena, record, honest, counting.evaluations, alone, norm)


def _tickets(arena: Arena, record: RoundRecord) -> dict[str, int]:
    secret = RoundSecret.derive(identity_for("validator"), arena.validator.run_id, record.report.round).key("admission")
    return {s: newcomer_ticket(secret, s) for s in record.senders}


def test_a_flood_of_valid_noise_is_examined_only_up_to_the_budget(
    flooded: Flooded,
) -> None:
    arena, record, honest, loads = flooded.arena, flooded.record, flooded.honest, flooded.loads
    reasons = {record.senders[o.index]: o.reason for o in record.report.outcomes}
    kinds = dict(zip(record.senders, record.kinds, strict=True))
    ours = {m.key for m in honest}
    assert all(not reasons[k].startswith(NOT_EXAMINED) for k in ours)
    assert {record.senders[o.index] for o in record.report.selected()} & ours
    tickets = _tickets(arena, record)
    decodable = sorted((k for k in reasons if k not in ours and kinds[k] != "junk"), key=tickets.__getitem__)
    examined = [k for k in decodable if not reasons[k].startswith(NOT_EXAMINED)]
    assert examined == decodable[:BUDGET]  # the lowest tickets, and no more
    noise = [o.norm for o in record.report.outcomes if kinds[record.senders[o.index]] == "freshnoise" and o.norm]
    assert noise and all(n == pytest.approx(flooded.norm, rel=1e-3) for n in noise)  # inside the norm band
    for k in decodable[BUDGET:]:
        assert reasons[k].startswith(f"{NOT_EXAMINED}this round's {BUDGET} newcomer examinations"), reasons[k]
    # each examined update and its reference are loaded once: the established three and the budget
    assert loads <= 2 * (len(honest) + BUDGET) < 2 * (len(honest) + len(decodable))
    # nothing is held against a key left unexamined: it is not even rated (rated last, it would be)
    assert not set(decodable[BUDGET:]) & set(arena.validator.ratings.records)


def test_junk_does_not_spend_the_budget(flooded: Flooded) -> None:
    """Every junk payload with a ticket below the last examined newcomer's was decoded (and refused
    as undecodable), yet the budget still went to four payloads that decode."""
    arena, record, honest = flooded.arena, flooded.record, flooded.honest
    tickets = _tickets(arena, record)
    reasons = {record.senders[o.index]: o.reason for o in record.report.outcomes}
    kinds = dict(zip(record.senders, record.kinds, strict=True))
    newcomers = [k for k in reasons if k not in {m.key for m in honest}]
    junk = [k for k in newcomers if kinds[k] == "junk"]
    last = max(tickets[k] for k in newcomers if kinds[k] != "junk" and not reasons[k].startswith(NOT_EXAMINED))
    below = [k for k in junk if tickets[k] < last]
    assert below, "no junk ticket fell before the last examined newcomer: the test proves nothing"
    assert all(reasons[k].startswith("undecodable") for k in below), [reasons[k] for k in below]


def test_a_payload_that_fails_after_a_decodes_work_spends_the_budget(flooded: Flooded) -> None:
    """Late junk among the lowest tickets was decoded, refused as undecodable, and counted: the
    budget's other examinations went to payloads that decode, and no more of them (uncounted, a
    flood of late junk would make the round decode every seat)."""
    arena, record, honest = flooded.arena, flooded.record, flooded.honest
    tickets = _tickets(arena, record)
    reasons = {record.senders[o.index]: o.reason for o in record.report.outcomes}
    kinds = dict(zip(record.senders, record.kinds, strict=True))
    counted = sorted(
        (k for k in reasons if k not in {m.key for m in honest} and kinds[k] != "junk"), key=tickets.__getitem__
    )[:BUDGET]
    late = [k for k in counted if kinds[k] == "latejunk"]
    assert late, "no late junk had one of the lowest tickets: the test proves nothing"
    assert all(reasons[k].startswith("undecodable: MalformedPayload") for k in late), [reasons[k] for k in late]
    decoded = [k for k in reasons if kinds[k] in ("freshnoise", "honest") and k not in {m.key for m in honest}]
    examined = [k for k in decoded if not reasons[k].startswith(NOT_EXAMINED)]
    assert len(examined) == BUDGET - len(late)


def test_fresh_noise_does_not_move_the_established_miners_references(flooded: Flooded) -> None:
    """The references are the other established miners' mean direction: the ten noise updates and the
    fresh honest one that were examined beside them change no established miner's gains, indicator
    or selection (with every examined update in the references, noise diluted them, and a whole
    round of honest miners could fail the own-data check at once)."""
    ours = {m.key for m in flooded.honest}
    flood = {o.sender: o for o in flooded.record.report.outcomes if o.sender in ours}
    alone = {o.sender: o for o in flooded.alone.outcomes}
    assert flood.keys() == alone.keys() == ours
    for key in ours:
        assert flood[key].gains == alone[key].gains and flood[key].status == alone[key].status, key


def test_passes_go_by_ticket_and_keep_arrival_order_within_each() -> None:
    budget = NewcomerBudget(
        frozenset({"est"}), frozenset({"earner"}), evaluations=3, secret=b"s", waited=frozenset("w")
    )
    ticket = {k: budget.ticket([k]) or 0 for k in ("a", "b", "c", "d", "earner", "w")}
    assert ticket["earner"] < ticket["w"] < min(ticket[k] for k in "abcd")  # whatever the draws
    fresh = sorted(("a", "b", "c", "d"), key=ticket.__getitem__)
    items = ["d", "est", "c", "w", "earner", "b", "a"]  # arrival order
    junk = {fresh[0]}  # the lowest fresh ticket fails to decode: the next one takes its place
    passes: list[list[str]] = []

    def examine(todo: list[str]) -> list[bool]:
        passes.append(list(todo))
        return [k not in junk for k in todo]

    left = examine_in_passes(items, lambda k: [k], budget, examine)
    first = [k for k in items if k in {"est", "earner", "w", fresh[0]}]  # established, earner, waited, fresh
    assert passes == [first, [fresh[1]]]
    assert left == fresh[2:]
    assert examine_in_passes(items, lambda k: [k], None, examine) == [] and passes[-1] == items


def test_a_newcomer_left_unexamined_goes_before_the_next_rounds_fresh_keys(tmp_path: Path) -> None:
    """A run that starts under a flood of valid noise from fresh keys every round: the honest
    newcomers draw for the examinations with the flood, and those left out are in the validator's
    book; next round each of them is examined before any fresh key (with the draw alone, each
    would face the flood again)."""
    swarm = make_swarm(newcomer_evaluations=3)
    honest = swarm.honest(3)
    validator = swarm.validator(tmp_path)
    norm = newcomerflood.honest_norm(validator, swarm.setup)
    arena = Arena(validator, honest)
    ours = {m.key for m in honest}
    left_out: set[str] = set()
    for r in range(2):
        noise = [FreshNoise(swarm.setup, identity_for(f"newcomers/wait/{r}/{i}"), norm) for i in range(8)]
        arena.miners = [*honest, *noise]
        waited = set(validator.book.waited)
        assert waited == left_out  # what the round before left unexamined, and nothing else
        record = arena.play()
        reasons = {record.senders[o.index]: o.reason for o in record.report.outcomes}
        left_out = {k for k, why in reasons.items() if why.startswith(NOT_EXAMINED)}
        if r == 0:
            assert left_out & ours, "every honest newcomer was examined in round 0: the test proves nothing"
        else:
            assert not waited & left_out  # each one that waited was examined
    assert set(validator.book.waited) == left_out


def test_the_flood_bench_reports_each_flooded_round(tmp_path: Path) -> None:
    """`pulse bench gauntlet --flood N`'s measurement: established honest miners, then N noise keys."""
    swarm = make_swarm(newcomer_evaluations=2)
    honest = swarm.honest(3)
    out = newcomerflood.measure(swarm.validator(tmp_path), honest, swarm.setup, keys=5)
    assert out.unexamined == [3] * newcomerflood.FLOOD_ROUNDS  # 5 noise keys, 2 examined a round
    assert all(n > 0 for n in out.honest) and out.warmup_rounds >= 2
    assert set(out.summary()) >= {"flood_validator_seconds_per_round", "flood_honest_aggregated"}
    assert out.flood == [0] * newcomerflood.FLOOD_ROUNDS and not out.cold


def test_the_flood_bench_can_start_the_flood_with_the_run(tmp_path: Path) -> None:
    """`--flood-cold --flood-norm 0.01`: the noise from round 0 at a hundredth of an honest update's
    norm, the same keys every round; every round is reported, with the flood's keys aggregated."""
    swarm = make_swarm(newcomer_evaluations=2)
    honest = swarm.honest(3)
    v = swarm.validator(tmp_path)
    norm = newcomerflood.honest_norm(v, swarm.setup)
    out = newcomerflood.measure(v, honest, swarm.setup, keys=5, norm_share=0.01, cold=True)
    rounds = newcomerflood.COLD_ROUNDS
    assert out.cold and out.warmup_rounds == 0 and out.quiet_seconds is None
    assert len(out.seconds) == len(out.honest) == len(out.flood) == len(out.unexamined) == rounds
    assert norm > 0 and out.summary()["flood_norm_share"] == 0.01
    assert out.unexamined[0] == 5 + 3 - 2  # round 0: the honest miners are newcomers too, 2 examined
    assert all(0 <= n <= 3 for n in out.honest) and all(n >= 0 for n in out.flood)
