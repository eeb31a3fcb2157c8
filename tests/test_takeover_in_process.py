"""Two validators on the in-memory network: the chain rule, a standby that takes a round over, a
returning validator that catches up as a standby, and an auditing follower.

The real roles (`ValidatorRole`, miners, a follower with `--audit`) run whole rounds of a tiny GPT
in one process (`node/net/memory.py`); the active validator "dies" (its task cancelled, its peer
gone from the network) while it collects a round, or (a second run) right after it published a
round's result, never to come back: the standby holds that round's blobs (`roles/replicas.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch

from node.events import EventLog, Events
from node.events.audit import Audited, AuditMismatch, Replicated, Standby, StoodDown, TookOver
from node.events.models import Done, RoundClosed, RoundOpened, Submitted
from node.net.memory import MemoryNetwork
from node.roles.intake import RoundIntake
from node.roles.records import run_records
from node.roles.tasks import follower_for, miner_for, validator_role_for
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.messages import RoundResult
from protocol.signing import open_signed
from pulse_redteam.lying import lying_validator
from tests.helpers import apoll
from tests.rounds import (
    key,
    two_validators_manifest,
)
from validator.core import Validator
from validator.state import StateStore

ROUNDS = 4
POLL = 0.05
TIMEOUT = 300.0  # generous: the run is ~25 s on an idle 2-core machine, minutes under heavy load


class Run:
    def __init__(self, root: Path, rounds: int = ROUNDS) -> None:
        self.root, self.rounds = root, rounds
        self.setup = RunSetup.from_manifest(two_validators_manifest())
        self.task = task_for(self.setup)
        self.network = MemoryNetwork(run_records(self.setup.manifest))
        self.running: dict[str, asyncio.Future[Any]] = {}
        self.peers: dict[str, Any] = {}

    def events(self, name: str, role: str) -> Events:
        return Events(role, self.root / "events" / f"{name}.jsonl")

    def start(self, name: str, role: str) -> None:
        me = key(name.removesuffix("-again"))
        events = self.events(name, role)
        folder = self.root / name.removesuffix("-again")
        intake = RoundIntake(self.setup, events, folder / "inbox") if role == "validator" else None
        peer = self.network.join(me, folder, role=role, intake=intake)  # type: ignore[arg-type]
        self.peers[name] = peer
        if intake is not None:
            role_ = validator_role_for(self.setup, self.task, me, folder, peer, events, intake, poll=POLL)
            work = role_.run(self.rounds)
        elif role == "miner":
            work = miner_for(self.setup, self.task, me, peer, events, poll=POLL).run(self.rounds)
        else:
            audit = folder / "audit" if name.startswith("auditor") else None
            work = follower_for(self.setup, self.task, me, peer, events, poll=POLL, audit=audit).run(self.rounds)
        self.running[name] = asyncio.ensure_future(work)

    async def kill(self, name: str) -> None:
        """Gone at once: its task cancelled and its peer off the network (its records stay in the DHT)."""
        task = self.running.pop(name)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self.peers[name].shutdown()

    def log(self) -> EventLog:
        from node.events import read_events

        return read_events(self.root / "events")

    async def until(self, what: str, found: Any) -> None:
        assert await apoll(lambda: found(self.log()), TIMEOUT, POLL), f"timed out waiting for {what}"

    async def stop(self) -> None:
        for future in self.running.values():
            future.cancel()
        for future in self.running.values():
            with contextlib.suppress(asyncio.CancelledError):
                await future
        await self.network.shutdown()


async def play(run: Run) -> None:
    try:
        run.start("validator-a", "validator")
        run.start("validator-b", "validator")
        for name in ("miner0", "miner1", "miner2"):
            run.start(name, "miner")
        run.start("auditor", "follower")
        run.start("follower", "follower")
        await run.until("round 2 opening at a", lambda log: log.has(RoundOpened, "validator-a", 2))
        await run.kill("validator-a")  # dies while it collects round 2
        await run.until("b closing round 2", lambda log: log.has(RoundClosed, "validator-b", 2))
        run.start("validator-a-again", "validator")  # comes back on its state: the chain moved on
        waiting = [run.running[n] for n in ("miner0", "miner1", "miner2", "auditor", "follower")]
        await asyncio.wait_for(asyncio.gather(*waiting), TIMEOUT)
        await run.until("a back on the head", lambda log: log.has(Done, "validator-a-again"))
    finally:
        await run.stop()


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, EventLog]:
    torch.set_num_threads(1)
    run = Run(tmp_path_factory.mktemp("takeover"))
    asyncio.run(play(run))
    return run, run.log()


def counted(run: Run) -> list[RoundResult]:
    """The chain of counted results, from each round's records (the chain rule, from W_0)."""
    out: list[RoundResult] = []
    state = StateStore(run.root / "validator-b" / "validator").load()
    assert state.book.round == run.rounds
    for r in range(run.rounds):
        found = run.network.get(RoundResult, r)
        base = out[-1].new_state_hash if out else None
        order = list(run.setup.manifest.validators)
        mine = [v for v in found if base is None or v.message.base_state_hash == base]
        out.append(min(mine, key=lambda v: order.index(v.sender_hex)).message)
    return out


def test_a_standby_takes_the_round_over_and_the_chain_goes_on(played: tuple[Run, EventLog]) -> None:
    _, log = played
    took = log.events(TookOver, "validator-b")
    assert [t.round for t in took] == [2] and took[0].previous == key("validator-a").public_hex
    closed = {e.round: name for name in ("validator-a", "validator-b") for e in log.events(RoundClosed, name)}
    assert closed == {0: "validator-a", 1: "validator-a", 2: "validator-b", 3: "validator-b"}
    finals = log.final_hashes()
    assert len(set(finals.values())) == 1, finals  # miners, followers, both validators
    assert set(finals) >= {"miner0", "miner1", "miner2", "auditor", "follower", "validator-a-again"}


def test_the_round_taken_over_scores_what_the_miners_pushed_once(played: tuple[Run, EventLog]) -> None:
    run, log = played
    chain = counted(run)
    scored = [(s.sender, s.payload_sha256) for r in chain for s in (*r.selected, *r.rejections)]
    assert len(scored) == len(set(scored))  # nothing scored twice
    keys = log.keys()
    for name in ("miner0", "miner1", "miner2"):
        for sent in log.events(Submitted, name):
            named = {s.sender for s in (*chain[sent.round].selected, *chain[sent.round].rejections)}
            assert keys[name] in named, (name, sent.round)  # nothing lost: round 2's too


def test_the_auditing_follower_verified_every_round(played: tuple[Run, EventLog]) -> None:
    _, log = played
    assert [e.round for e in log.events(Audited, "auditor")] == list(range(ROUNDS))
    assert not log.events(AuditMismatch)
    assert log.events(Audited, "validator-b")  # the standby audited rounds 0 and 1 before taking over


def test_the_returning_validator_catches_up_as_a_standby(played: tuple[Run, EventLog]) -> None:
    _, log = played
    assert log.events(Standby, "validator-a-again")
    assert {e.round for e in log.events(Audited, "validator-a-again")} >= {2, 3}
    assert not log.events(RoundClosed, "validator-a-again") and not log.events(StoodDown)


def test_two_results_for_one_round_the_first_validator_in_the_manifest_counts(tmp_path: Path) -> None:
    """Both validators close round 0 from W_0 with different states; whatever order the records
    arrive in, every node counts validator a's (first in the manifest) once it is published."""
    setup = RunSetup.from_manifest(two_validators_manifest())
    task = task_for(setup)
    cfg, run_id = setup.manifest.gauntlet(), setup.run_id
    a, b = key("validator-a"), key("validator-b")
    va = Validator.create(tmp_path / "a", cfg, run_id, a, task.initial_master(), task.evaluator(), task.batch_fn())
    vb = lying_validator("add").create(
        tmp_path / "b", cfg, run_id, b, task.initial_master(), task.evaluator(), task.batch_fn()
    )
    ra, rb = va.run_round([]), vb.run_round([])
    assert ra.result.base_state_hash == rb.result.base_state_hash and ra.state_hash != rb.state_hash

    async def main() -> None:
        network = MemoryNetwork(run_records(setup.manifest))
        pa, pb = network.join(a, tmp_path / "pa", role="validator"), network.join(b, tmp_path / "pb", role="validator")
        reader = network.join(key("reader"), tmp_path / "reader", role="follower")
        await pb.publish_signed(rb.envelope)  # b's lands first
        for peer, report in ((pa, ra), (pb, rb)):
            peer.hold(peer.store.put(report.patch), 0)
            await peer.heartbeat(1, report.state_hash)
        found = await reader.counted_result(0, ra.result.base_state_hash)
        assert found is not None and found.sender_hex == b.public_hex  # alone, it counts
        await pa.publish_signed(ra.envelope)
        found = await reader.counted_result(0, ra.result.base_state_hash)
        assert found is not None and found.sender_hex == a.public_hex  # a comes first in the manifest
        assert await reader.counted_result(0, "0" * 64) is None  # neither starts from another state
        await network.shutdown()

    asyncio.run(main())
    assert open_signed(ra.envelope, run_id=run_id, expect=RoundResult).message.round == 0


# -- killed right after publishing, never restarted -------------------------------------------------

PUBLISHED = 1  # validator a is killed as soon as its result of this round is in the DHT


async def play_killed_after_publishing(run: Run) -> None:
    a = key("validator-a").public_hex
    try:
        run.start("validator-a", "validator")
        run.start("validator-b", "validator")
        for name in ("miner0", "miner1", "miner2"):
            run.start(name, "miner")
        run.start("auditor", "follower")

        def published() -> bool:
            return any(v.sender_hex == a for v in run.network.get(RoundResult, PUBLISHED))

        assert await apoll(published, TIMEOUT, 0.01), "a never published"
        await run.kill("validator-a")  # nobody fetched its patch or evidence from it yet: only b holds them
        waiting = [run.running[n] for n in ("miner0", "miner1", "miner2", "auditor")]
        await asyncio.wait_for(asyncio.gather(*waiting), TIMEOUT)
        await run.until("b done", lambda log: log.has(Done, "validator-b"))
    finally:
        await run.stop()


@pytest.fixture(scope="module")
def killed_after_publishing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, EventLog]:
    torch.set_num_threads(1)
    run = Run(tmp_path_factory.mktemp("published"), rounds=PUBLISHED + 2)
    asyncio.run(play_killed_after_publishing(run))
    return run, run.log()


def test_killed_right_after_publishing_the_standby_holds_the_round_and_goes_on(
    killed_after_publishing: tuple[Run, EventLog],
) -> None:
    run, log = killed_after_publishing
    replicated = [e for e in log.events(Replicated, "validator-a") if e.round == PUBLISHED]
    assert replicated and replicated[0].acknowledged == 1  # b held the blobs before a published
    # b verified a's last round from what it was handed (a was gone before anyone else fetched it)
    assert {e.round for e in log.events(Audited, "validator-b")} >= {PUBLISHED}
    assert [t.round for t in log.events(TookOver, "validator-b")] == [PUBLISHED + 1]
    chain = counted(run)
    a, b = key("validator-a").public_hex, key("validator-b").public_hex
    signers = [
        next(v.sender_hex for v in run.network.get(RoundResult, r) if v.message == c) for r, c in enumerate(chain)
    ]
    assert signers == [a, a, b]  # a's last result counts; b goes on from it
    assert len(run.network.get(RoundResult, PUBLISHED + 1)) == 1
    finals = log.final_hashes()
    assert set(finals) >= {"miner0", "miner1", "miner2", "auditor", "validator-b"}
    assert len(set(finals.values())) == 1, finals  # one chain of hashes
    assert [e.round for e in log.events(Audited, "auditor")] == list(range(run.rounds))
    assert not log.events(AuditMismatch)
    # no round lost: the round taken over scores what every miner pushed for it, once
    keys = log.keys()
    for name in ("miner0", "miner1", "miner2"):
        for sent in log.events(Submitted, name):
            named = [s.sender for s in (*chain[sent.round].selected, *chain[sent.round].rejections)]
            assert named.count(keys[name]) == 1, (name, sent.round)
