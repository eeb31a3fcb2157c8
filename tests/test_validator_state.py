"""Validator persistence: a kill at any persistence step resumes without losing or double-counting."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from node.bench.arena import Arena
from protocol.errors import ConfigError, CorruptState
from protocol.signing import SignedMessage
from tests.fakeswarm import Swarm, make_swarm
from validator import ledger
from validator.core import Validator
from validator.intake import Submission
from validator.state import LEDGER, STEPS, StateStore

ROUNDS = 3
KINDS = ("copycat", "freerider", "signflip", "replay")


class SimulatedCrash(Exception):
    """Raised by the crash hook: the process 'dies' right after a persistence step."""


@dataclass(frozen=True)
class Ending:
    chain: list[str]  # state hash after each round
    envelopes: list[bytes]  # signed result of each round
    patches: list[bytes]  # PULSESync patch of each round
    ratings: dict[str, object]
    indicators: dict[str, float]
    seen: list[str]
    outer_steps: int


def ending(v: Validator, chain: list[str], envelopes: list[bytes], patches: list[bytes]) -> Ending:
    book = v.book
    return Ending(
        chain, envelopes, patches, dict(book.ratings), dict(book.indicators), list(book.seen), book.outer_steps
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Swarm, list[list[Submission]], Ending]:
    """One run without crashes; its submissions are replayed into the crashing runs."""
    swarm = make_swarm(min_indicator_average=0.05)  # aggregate from round 1, so the master moves
    honest = swarm.honest(3)
    arena = Arena(
        swarm.validator(tmp_path_factory.mktemp("clean")), [*honest, *swarm.adversaries(KINDS, [m.key for m in honest])]
    )
    rounds, chain, envelopes, patches = [], [], [], []
    for _ in range(ROUNDS):
        subs, _, _ = arena.submissions()
        report = arena.validator.run_round(subs)
        rounds.append(subs)
        chain.append(report.state_hash)
        envelopes.append(report.envelope)
        patches.append(report.patch)
    assert len(set(chain)) == ROUNDS  # every round moved the weights
    return swarm, rounds, ending(arena.validator, chain, envelopes, patches)


def test_restart_after_every_persistence_step(
    uninterrupted: tuple[Swarm, list[list[Submission]], Ending], tmp_path: Path
) -> None:
    swarm, rounds, clean = uninterrupted
    # every step before the commit point, each followed by a rerun of the round; then one step
    # after it (the round is committed, so the next crash belongs to the next round)
    before = STEPS[: STEPS.index("commit")]
    after = STEPS[STEPS.index("commit") :]
    plan = [(r, step) for r in range(ROUNDS) for step in [*before, after[r % len(after)]]]
    pending = list(plan)

    def hook(step: str) -> None:
        if pending and pending[0] == (current.round, step):
            pending.pop(0)
            raise SimulatedCrash(step)

    swarm.validator(tmp_path)
    current = swarm.reopen(tmp_path, crash_hook=hook)
    chain: list[str] = []
    envelopes: list[bytes] = []
    patches: list[bytes] = []
    crashes = 0
    while current.round < ROUNDS:
        r = current.round
        try:
            report = current.run_round(rounds[r])
            chain.append(report.state_hash)
            envelopes.append(report.envelope)
            patches.append(report.patch)
        except SimulatedCrash as crash:
            crashes += 1
            current = swarm.reopen(tmp_path, crash_hook=hook)  # the process restarts from disk
            expected = r + 1 if STEPS.index(str(crash)) >= STEPS.index("commit") else r
            assert current.round == expected
            if current.round > r:  # committed before the crash: the result is on disk, ready to republish
                assert current.last_result is not None and current.last_patch is not None
                chain.append(current.state_hash)
                envelopes.append(current.last_result)
                patches.append(current.last_patch)
    assert crashes == len(plan) and not pending
    assert ending(current, chain, envelopes, patches) == clean  # the same bytes, signed result and patch
    # the ledger holds every round's signed result exactly once, though folders were pruned
    assert StateStore(tmp_path).results() == clean.envelopes
    assert [r for r, _ in ledger.read(tmp_path / LEDGER)] == list(range(ROUNDS))
    assert not (tmp_path / "round-000000000001").exists()


def test_a_round_rerun_from_its_committed_state_gives_the_same_bytes(
    uninterrupted: tuple[Swarm, list[list[Submission]], Ending], tmp_path: Path
) -> None:
    """Two processes that hold the same committed state and get the same submissions publish the
    same signed result and patch, byte for byte: nothing in a round depends on the process."""
    swarm, rounds, clean = uninterrupted
    swarm.validator(tmp_path / "a")
    first = swarm.reopen(tmp_path / "a")
    first.run_round(rounds[0])
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    twin = swarm.reopen(tmp_path / "b")
    for r in range(1, ROUNDS):
        mine, theirs = first.run_round(rounds[r]), twin.run_round(rounds[r])
        assert (mine.envelope, mine.patch) == (theirs.envelope, theirs.patch) == (clean.envelopes[r], clean.patches[r])
        assert mine.outcomes == theirs.outcomes and first.book == twin.book


def test_ledger_survives_a_torn_append_and_refuses_gaps(tmp_path: Path) -> None:
    path = tmp_path / LEDGER
    ledger.append(path, 0, b"zero")
    with path.open("ab") as f:
        f.write(b'{"envelope": "6f6e65", "rou')  # a crash in the middle of the next append
    assert ledger.read(path) == [(0, b"zero")]
    ledger.append(path, 1, b"one")
    ledger.append(path, 1, b"one again")  # a round already there is not appended twice
    assert ledger.read(path) == [(0, b"zero"), (1, b"one")]
    with pytest.raises(CorruptState):
        ledger.append(path, 3, b"three")
    path.write_bytes(path.read_bytes() + b"not json\n")
    with pytest.raises(CorruptState):
        ledger.read(path)


def test_ledger_appends_read_only_the_tail(tmp_path: Path) -> None:
    path = tmp_path / LEDGER
    big = [bytes([r]) * 40_000 for r in range(6)]  # lines of 80 KB: the file outgrows the tail read
    for r, envelope in enumerate(big):
        ledger.append(path, r, envelope)
        ledger.append(path, r, b"again")
    assert ledger.read(path) == list(enumerate(big))
    with path.open("ab") as f:
        f.write(b"x" * 300_000)  # a torn append longer than any entry: not a ledger any more
    with pytest.raises(CorruptState):
        ledger.append(path, 6, b"six")


def test_state_round_trips_and_rejects_corruption(tmp_path: Path) -> None:
    swarm = make_swarm()
    v = swarm.validator(tmp_path)
    with pytest.raises(ConfigError):
        swarm.validator(tmp_path)
    honest = swarm.honest(2)
    arena = Arena(v, honest)
    subs, _, _ = arena.submissions()
    v.run_round(subs)
    again = swarm.reopen(tmp_path)
    assert (again.round, again.state_hash, again.book) == (1, v.state_hash, v.book)
    assert all(SignedMessage.from_bytes(s.envelope).message_id in again.seen for s in subs)
    assert set(again.book.ratings) == set(again.book.indicators) == {m.key for m in honest}
    assert again.last_result == v.last_result and again.last_patch == v.last_patch
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "COMMITTED",
        LEDGER,
        "round-000000000000",
        "round-000000000001",
    ]
    assert StateStore(tmp_path).results() == [v.last_result]
    (tmp_path / "round-000000000002").mkdir()  # a crash mid-commit leaves a newer, uncommitted folder
    (tmp_path / "round-000000000002" / "weights.safetensors").write_bytes(b"partial")
    assert swarm.reopen(tmp_path).round == 1
    book = tmp_path / "round-000000000001" / "book.json"
    book.write_bytes(book.read_bytes().replace(b'"round":1', b'"round":2'))
    with pytest.raises(CorruptState):
        swarm.reopen(tmp_path)
    with pytest.raises(CorruptState):
        swarm.reopen(tmp_path / "missing")
