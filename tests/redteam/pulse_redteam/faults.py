"""A validator process that lies: the test double of the validator service for fault runs.

    python -m pulse_redteam.faults --lie add --from-round 1 --config run.toml --key v.key --state-dir D ...

A real validator (`ValidatorService` on libp2p, the flags of `pulse validator`) whose `Validator`
is `lying.lying_validator(lie, from_round)`: honest before `from_round`, then telling its lie every
round. `pulse bench failover` runs it to check that `pulse follow --audit` finds each lie and stays
on the last verified state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from node.events import Events
from node.net.keyfile import load_key_file
from node.net.netconfig import add_net_arguments, net_config_from_args
from node.net.p2ppeer import P2PPeer
from node.roles.intake import RoundIntake
from node.roles.records import run_records
from node.roles.tasks import validator_for
from node.run.manifest import load_manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from pulse_redteam.lying import LIES, lying_validator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pulse_redteam.faults")
    parser.add_argument("--lie", choices=LIES, required=True)
    parser.add_argument("--from-round", type=int, default=1)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--events", type=Path)
    parser.add_argument("--threads", type=int, default=0)  # accepted for `Swarm.start_role`; unused
    add_net_arguments(parser)
    args = parser.parse_args(argv)
    asyncio.run(_run(args))
    return 0


async def _run(args: argparse.Namespace) -> None:
    setup = RunSetup.from_manifest(load_manifest(args.config))
    identity, events = load_key_file(args.key), Events("validator", args.events)
    records = run_records(setup.manifest)
    intake = RoundIntake(setup, events, args.state_dir / "inbox")
    liar = lying_validator(args.lie, args.from_round)
    config = net_config_from_args(args)
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
