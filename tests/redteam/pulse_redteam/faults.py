"""A validator process that lies: the test double of the validator service for fault runs.

    python -m pulse_redteam.faults --lie add --from-round 1 --config run.toml --key v.key --state-dir D ...

A real validator (`ValidatorService` on libp2p, the flags of `pulse validator`) whose `Validator`
is `lying.lying_validator(lie, from_round)`: honest before `from_round`, then telling its lie every
round. `pulse bench failover` runs it to check that `pulse follow --audit` finds each lie and stays
on the last verified state.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from pydantic import Field, field_validator

from node.commands.options import script_options
from node.events import Events
from node.net.keyfile import load_key_file
from node.net.netconfig import NetOptions
from node.net.p2ppeer import P2PPeer
from node.roles.intake import RoundIntake
from node.roles.records import run_records
from node.roles.tasks import validator_for
from node.run.manifest import load_manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from pulse_redteam.lying import LIES, lying_validator


class FaultOptions(NetOptions):
    """The lying validator's options (`python -m pulse_redteam.faults`), as `pulse validator` takes them."""

    lie: str
    """what it lies about, one of `LIES`"""
    from_round: int = Field(default=1, ge=0)
    """the first round it lies in"""
    config: Path
    """run manifest TOML"""
    key: Path
    """the validator's key file"""
    state_dir: Path
    """the validator's state folder"""
    rounds: int | None = Field(default=None, ge=0)
    """stop after this round"""
    events: Path | None = None
    """JSON lines of what it did"""
    threads: int = 0
    """accepted for `Swarm.start_role`; unused"""

    @field_validator("lie")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in LIES:
            raise ValueError(f"{value!r} is not one of {LIES}")
        return value


def main(argv: list[str] | None = None) -> int:
    options = script_options(FaultOptions, argv, "python -m pulse_redteam.faults")
    asyncio.run(_run(options))
    return 0


async def _run(args: FaultOptions) -> None:
    setup = RunSetup.from_manifest(load_manifest(args.config))
    identity, events = load_key_file(args.key), Events("validator", args.events)
    records = run_records(setup.manifest)
    intake = RoundIntake(setup, events, args.state_dir / "inbox")
    liar = lying_validator(args.lie, args.from_round)
    config = args.net_config()
    peer = await P2PPeer.create(config, records, identity, args.state_dir, role="validator", intake=intake)
    try:
        loop = asyncio.get_running_loop()
        service = await loop.run_in_executor(
            None,
            lambda: validator_for(
                setup, task_for(setup), identity, args.state_dir, peer, events, intake, validator_class=liar
            ),
        )
        task = asyncio.ensure_future(service.run(args.rounds))
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await peer.shutdown()
        events.finish()


if __name__ == "__main__":
    sys.exit(main())
