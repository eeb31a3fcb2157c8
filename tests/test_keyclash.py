"""Two validators with one key: the newcomer stops before it writes anything, the running one stops
when a head it did not write appears, and a restart of the same validator (same state folder,
new libp2p peer) is not mistaken for one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node.events import Events
from node.net.memory import MemoryNetwork
from node.roles.intake import RoundIntake
from node.roles.keyclash import SameKeyElsewhere
from node.roles.records import run_records
from node.roles.tasks import validator_for
from node.roles.validator_service import ValidatorService
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.identity import Identity
from protocol.messages import CheckpointAnnouncement

ME = Identity.generate()
SETUP = RunSetup.from_manifest(Manifest.model_validate({"name": "keyclash", "validators": [ME.public_hex]}))


def _service(net: MemoryNetwork, folder: Path) -> ValidatorService:
    events = Events("validator")
    intake = RoundIntake(SETUP, events, folder / "inbox")
    peer = net.join(ME, folder, role="validator", intake=intake)
    return validator_for(SETUP, task_for(SETUP), ME, folder, peer, events, intake)


async def _publish(service: ValidatorService) -> None:
    """A checkpoint of the service's state and the run's head naming it."""
    v = service.validator
    await service.publisher.announce_checkpoint(service.round, v.weights, v.state_hash)
    await service.publisher.publish_head(service.round, v.state_hash)


def test_a_second_validator_with_the_same_key_stops_in_one_line(tmp_path: Path) -> None:
    net = MemoryNetwork(run_records(SETUP.manifest))
    first = _service(net, tmp_path / "first")

    async def main() -> None:
        for _ in range(3):
            first.validator.run_round([])
        await _publish(first)  # the run is at round 3

        restarted = _service(net, tmp_path / "first")  # kill -9 and the same command: its own head passes
        await restarted.key_watch.check(restarted.peer, restarted.round, restarted.validator.state_hash)

        newcomer = _service(net, tmp_path / "second")  # a fresh state folder, the same key
        with pytest.raises(SameKeyElsewhere, match="at round 3, this validator at round 0") as stopped:
            await newcomer._open(checkpoint=True)
        assert "\n" not in str(stopped.value)
        assert await newcomer.peer.from_validator(CheckpointAnnouncement, 0) is None  # it wrote nothing

        # the other way round: a newcomer's head (another peer, since the first started) stops the first
        await _publish(newcomer)
        first.key_watch.started -= 5
        with pytest.raises(SameKeyElsewhere, match="since this validator started"):
            await first.key_watch.check(first.peer, first.round, first.validator.state_hash)

    asyncio.run(main())


def test_the_head_refreshed_while_a_round_closes_is_not_a_half_stepped_state(tmp_path: Path) -> None:
    """The state steps in a thread, its round before its hash: a head refreshed in between named the
    next round with the old state, and the validator stopped itself as "another validator" (seen
    under load)."""
    service = _service(MemoryNetwork(run_records(SETUP.manifest)), tmp_path)
    v, seen = service.validator, []
    before = (service.round, v.state_hash)

    def half_stepped(submissions: object) -> None:
        v.book = v.book.model_copy(update={"round": v.book.round + 1})  # the round moved, the hash not yet
        seen.append(service._where())
        raise RuntimeError("stop in the middle")

    v.run_round = half_stepped  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError, match="stop in the middle"):
        asyncio.run(service._close())
    assert seen == [before]
