"""Joining a run that has gone on for a while, on the in-memory network (`node/net/memory.py`).

Round results and checkpoint announcements live `record_ttl_seconds` under their own round's key,
so a joiner cannot find the run by searching from round 0 once round 0's records are gone. The
validator's head (`RunHead`, at one fixed key, re-published every round and on a timer) says where
the run is: a joiner reads it, loads the checkpoint it names and applies the patches since.

- a chain whose early records are gone (never published here), at round 10 and at round 1,000:
  the follower joins, in the same number of DHT reads at both rounds;
- a real validator service with a 2 s record lifetime: a follower that joins after round 0's
  records expired catches up, and the validator stops by itself after `rounds`;
- a follower of a run with no validator at all says so after a short wait instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from node.events import EventLog, Events, read_events
from node.events.models import CheckpointLoaded, Quiet, RoundClosed
from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.roles.catchup import CHECKPOINT_FORMAT
from node.roles.chainstate import checkpoint_bytes
from node.roles.follower import Follower
from node.roles.intake import RoundIntake
from node.roles.records import run_records
from node.roles.tasks import follower_for, miner_for, validator_for
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol import pulsesync
from protocol.errors import NetworkError
from protocol.identity import Identity
from protocol.messages import HEAD_ROUND, CheckpointAnnouncement, RoundResult, RunHead, WireModel
from protocol.state import StateDict
from protocol.statehash import state_hash
from tests.helpers import commitments
from tests.rounds import (
    SELECTION,
)

TIMEOUT = 60.0


def key(label: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(f"pulse-test-joining/{label}".encode()).digest())


VALIDATOR = key("validator")
RUN = hashlib.sha256(b"pulse-test-joining").hexdigest()


def fabricate_chain(net: MemoryNetwork, folder: Path, open_round: int, patches: int) -> str:
    """A validator that is at `open_round`: a checkpoint `patches` rounds back and the results since,
    nothing older (expired). Returns the state hash of W_open_round."""
    validator = net.join(VALIDATOR, folder, role="validator")
    gen = torch.Generator().manual_seed(open_round)
    weights: StateDict = {"w": torch.randn(64, 64, generator=gen).to(torch.bfloat16)}
    c = open_round - patches
    data = checkpoint_bytes(weights)
    validator.hold(sha := validator.store.put(data), c, "checkpoint")
    checkpoint = CheckpointAnnouncement(
        run_id=RUN, round=c, state_hash=state_hash(weights), blob_sha256=sha, blob_size=len(data),
        format=CHECKPOINT_FORMAT,
    )  # fmt: skip
    records: list[WireModel] = []
    for r in range(c, open_round):
        new = {"w": (weights["w"].float() + 0.01 * torch.randn(64, 64, generator=gen)).to(torch.bfloat16)}
        patch = pulsesync.encode(weights, new)
        validator.hold(validator.store.put(patch), r)
        records.append(
            RoundResult(
                run_id=RUN,
                round=r,
                selected=(),
                rejections=(),
                base_state_hash=state_hash(weights),
                patch_sha256=hashlib.sha256(patch).hexdigest(),
                patch_size=len(patch),
                new_state_hash=state_hash(new),
                **commitments(str(r)),
            )
        )
        weights = new
    records.append(
        RunHead(
            run_id=RUN,
            round=HEAD_ROUND,
            open_round=open_round,
            state_hash=state_hash(weights),
            checkpoint=checkpoint,
            validator_peer=validator.peer_id,
            sent_at=int(time.time()),
        )
    )

    async def publish() -> None:
        for message in records:
            await validator.publish(message)

    asyncio.run(publish())
    return state_hash(weights)


def join_reads(folder: Path, open_round: int) -> int:
    """The DHT records (kind, round) a new follower reads to reach W_open_round of a run whose early
    records are gone (distinct ones: a poll that reads one again while a fetch is under way depends
    on timing, not on the round)."""
    net = MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5))
    final = fabricate_chain(net, folder / "validator", open_round, patches=3)
    peer = net.join(key("joiner"), folder / "joiner", role="follower")
    reads: set[tuple[str, int]] = set()
    read = peer._get

    async def counted(kind: type[Any], round_: int) -> list[Any]:
        reads.add((kind.KIND, round_))
        return await read(kind, round_)

    peer._get = counted  # type: ignore[method-assign]
    follower = Follower(peer, Events("follow", folder / "joiner.jsonl"), poll=0.05)
    held = asyncio.run(asyncio.wait_for(follower.run(open_round), TIMEOUT))
    assert (held.round, held.state_hash) == (open_round, final)
    loaded = read_events(folder).events(CheckpointLoaded)
    assert [e.round for e in loaded] == [open_round - 3]  # the head's checkpoint, then 3 patches
    return len(reads)


def test_a_joiner_finds_the_run_without_its_first_records_in_constant_reads(tmp_path: Path) -> None:
    # both past the join planner's lookback (two checkpoint periods priced, `roles/joinplan.py`)
    early, late = join_reads(tmp_path / "30", 30), join_reads(tmp_path / "1000", 1000)
    assert early == late, (early, late)


def test_the_newest_validator_head_wins(tmp_path: Path) -> None:
    """Heads are signed with their time; a reader keeps the newest, and only a validator's is stored."""
    net = MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5))
    validator = net.join(VALIDATOR, tmp_path / "v", role="validator")
    stranger = net.join(key("stranger"), tmp_path / "s", role="miner")
    checkpoint = CheckpointAnnouncement(
        run_id=RUN, round=0, state_hash="1" * 64, blob_sha256="2" * 64, blob_size=1, format=CHECKPOINT_FORMAT
    )

    def head(open_round: int, sent_at: int) -> RunHead:
        return RunHead(
            run_id=RUN, round=HEAD_ROUND, open_round=open_round, state_hash="3" * 64, checkpoint=checkpoint,
            validator_peer=validator.peer_id, sent_at=sent_at,
        )  # fmt: skip

    async def main() -> RunHead | None:
        await validator.publish(head(5, 50))
        await asyncio.sleep(0.01)  # a later signed expiry: of one owner's two records, the later-expiring is kept
        await validator.publish(head(7, 100))
        with pytest.raises(NetworkError, match="no peer stored head"):  # not a validator: refused at store time
            await stranger.publish(head(99, 200))
        return await stranger.head()

    found = asyncio.run(main())
    assert found is not None and found.open_round == 7
    with pytest.raises(ValidationError, match="stored at round"):  # one fixed key: its round is always HEAD_ROUND
        RunHead.model_validate(head(7, 1).model_dump() | {"round": 3})


# -- a real validator whose records expire --------------------------------------------------------


ROUNDS = 14  # at least 7 s (min_seconds): the late follower joins while the run goes on


def short_lived() -> Manifest:
    return Manifest.model_validate(
        {
            "name": "short-lived",
            "validators": [VALIDATOR.public_hex],
            "model": {"gpt": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32}},
            "data": {"batch_size": 4, "seq_len": 32},
            "train": {"inner_steps": 2, "inner": {"lr": 3e-3}},
            "round": {"deadline_seconds": 20.0, "min_seconds": 0.5, "checkpoint_every": 3, "record_ttl_seconds": 2.0},
            "selection": {**SELECTION, "held_out_batches": 1},
        }
    )


async def play(root: Path) -> tuple[bool, float]:
    """A validator and a miner run ROUNDS rounds; a follower joins once round 0's records are gone.
    Returns whether the validator stopped by itself, and how long after the others it did."""
    manifest = short_lived()
    setup = RunSetup.from_manifest(manifest)
    task = task_for(setup)
    net = MemoryNetwork(run_records(manifest))

    def events(name: str, role: str) -> Events:
        return Events(role, root / "events" / f"{name}.jsonl")

    vevents = events("validator", "validator")
    intake = RoundIntake(setup, vevents, root / "validator" / "inbox")
    peer = net.join(VALIDATOR, root / "validator", role="validator", intake=intake)
    service = validator_for(setup, task, VALIDATOR, root / "validator", peer, vevents, intake, poll=0.05)
    validating = asyncio.ensure_future(service.run(ROUNDS))
    miner = miner_for(
        setup, task, key("miner"), net.join(key("miner"), root / "m", role="miner"), events("miner", "miner"), poll=0.05
    )
    mining = asyncio.ensure_future(miner.run(ROUNDS))
    try:
        while not read_events(root / "events").has(RoundClosed, "validator", 3):
            await asyncio.sleep(0.1)
        # round 0's result is re-published until the checkpoint of round 3: 2.5 s after it, it has expired
        await asyncio.sleep(2.5)
        assert await peer.round_result(0) is None
        me = key("late")
        late = follower_for(
            setup, task, me, net.join(me, root / "late", role="follower"), events("late", "follow"), poll=0.05
        )
        await asyncio.wait_for(asyncio.gather(mining, late.run(ROUNDS)), TIMEOUT)
        others_done = time.monotonic()
        await asyncio.wait_for(asyncio.shield(validating), 10.0)
        return validating.done() and not validating.cancelled(), time.monotonic() - others_done
    finally:
        for work in (validating, mining):
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await work
        await net.shutdown()


@pytest.fixture(scope="module")
def expired_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[EventLog, bool, float]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("joining")
    stopped, after = asyncio.run(play(root))
    return read_events(root / "events"), stopped, after


def test_a_follower_joins_after_the_first_records_expired(expired_run: tuple[EventLog, bool, float]) -> None:
    log, _, _ = expired_run
    finals = log.final_hashes()
    assert set(finals) >= {"validator", "miner", "late"} and len(set(finals.values())) == 1
    assert log.events(CheckpointLoaded, "late")[0].round >= 3  # from the head's checkpoint, not round 0


def test_the_validator_stops_after_its_rounds(expired_run: tuple[EventLog, bool, float]) -> None:
    """`rounds` stops the validator once the nodes of the run hold the final state (it used to serve forever)."""
    log, stopped, after = expired_run
    assert stopped and after < 5.0
    assert [e.round for e in log.events(RoundClosed, "validator")] == list(range(ROUNDS))


# -- nothing to find ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("other run", "is your manifest the validator's? (run ids differ when one byte differs)"),
        ("no validator", "the manifest names no validator"),
        ("no initial peers", "started without --initial-peers"),
    ],
)
def test_a_node_that_finds_no_validator_says_so(tmp_path: Path, case: str, expected: str) -> None:
    """Another run id (a manifest that differs from the validator's: nothing of its run is visible),
    a manifest with no validator, no --initial-peers: the node used to wait in silence after 'joined'."""
    validators = () if case == "no validator" else (VALIDATOR.public_hex,)
    net = MemoryNetwork(RunRecords(RUN, validators, 3600.0, 5))
    events = Events("follow", tmp_path / "events" / "f.jsonl")
    peer = net.join(key("lonely"), tmp_path / "f", role="follower")
    peer.alone = case == "no initial peers"
    follower = Follower(peer, events, poll=0.05)
    follower.chain.quiet_seconds = 0.3

    async def wait(follower: Follower) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(follower.run(1), 1.0)

    asyncio.run(wait(follower))
    said = read_events(tmp_path / "events").events(Quiet)
    assert said, "no word after a second of finding nothing"
    assert expected in said[0].hint and said[0].run_id == RUN and said[0].seconds >= 0.3
    assert len(said) <= 2  # then at doubling intervals, not every poll
