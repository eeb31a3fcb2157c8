"""The roles of a run, built from its task: the one place that maps a `Task` to what each role runs.

    intake = RoundIntake(setup, events, folder / "inbox")         # before the peer: its `rpc_submit` ends there
    service = validator_for(setup, task, identity, folder, peer, events, intake)   # + RoundHooks of the task
    role = validator_role_for(setup, task, identity, folder, peer, events, intake) # active or standby
    miner = miner_for(setup, task, identity, peer, events)                 # + the trainer's RoundInputs
    follower = follower_for(setup, task, identity, peer, events)           # + the task's RoundServices

| task | validator's round hooks                    | miner's round inputs     | follower's round services | standby |
|------|--------------------------------------------|--------------------------|---------------------------|---------|
| lm   | held-out loss (`hooks.py`)                 | none                     | none                      | yes     |
| rl   | pool, held-out reward (`rl/validation.py`) | the pool (`rl/miner.py`) | rollouts (`rl/worker.py`) | no      |

Each column is a `functools.singledispatch` function on the task's class (the last, `takes_over`:
whether a standby validator may close a round another validator opened): a new task registers its
own pieces here, and the roles themselves never ask which task they run.
"""

from __future__ import annotations

import logging
from functools import singledispatch
from pathlib import Path

from node.events import Events
from node.net.peer import Peer
from node.roles.auditor import Auditor
from node.roles.follower import Follower, RoundService
from node.roles.hooks import HeldOutLoss, RoundHooks
from node.roles.intake import RoundIntake
from node.roles.miner import Miner, RoundInputs
from node.roles.rl.miner import PoolInputs
from node.roles.rl.validation import RLRoundHooks
from node.roles.rl.worker import RolloutWorker
from node.roles.standby import ValidatorRole
from node.roles.validator_service import ValidatorService
from node.run.setup import RunSetup
from node.run.task import LMTask, RLTask, Task
from node.run.trainer import Trainer
from protocol.identity import Identity
from validator.core import Validator

POLL_SECONDS = 0.5

log = logging.getLogger(__name__)


def validator_for(
    setup: RunSetup,
    task: Task,
    identity: Identity,
    folder: Path,
    peer: Peer,
    events: Events,
    intake: RoundIntake,
    *,
    poll: float = POLL_SECONDS,
    device: str = "cpu",
    validator_class: type[Validator] = Validator,
) -> ValidatorService:
    """The validator service of the run (builds or reopens its state: run it in an executor); its
    evaluation and held-out measures run on `device` where the task can use one."""
    hooks = round_hooks(task, peer, events, poll, device)
    return ValidatorService(
        setup,
        task,
        hooks,
        identity,
        folder,
        peer,
        events,
        intake,
        poll=poll,
        device=device,
        validator_class=validator_class,
    )


def validator_role_for(
    setup: RunSetup,
    task: Task,
    identity: Identity,
    folder: Path,
    peer: Peer,
    events: Events,
    intake: RoundIntake,
    *,
    poll: float = POLL_SECONDS,
    device: str = "cpu",
) -> ValidatorRole:
    """The validator of the run, active or standby (`standby.py`): what `pulse validator` runs."""
    hooks = round_hooks(task, peer, events, poll, device)
    return ValidatorRole(
        setup,
        task,
        hooks,
        identity,
        folder,
        peer,
        events,
        intake,
        poll=poll,
        can_take_over=takes_over(task),
        device=device,
    )


def miner_for(
    setup: RunSetup,
    task: Task,
    identity: Identity,
    peer: Peer,
    events: Events,
    *,
    device: str = "cpu",
    poll: float = POLL_SECONDS,
) -> Miner:
    warn_if_validator_key(identity, peer, "miner")
    trainer, inputs = trainer_and_inputs(task, identity, peer, device)
    return Miner(setup, peer, events, trainer, inputs, poll=poll)


def follower_for(
    setup: RunSetup,
    task: Task,
    identity: Identity,
    peer: Peer,
    events: Events,
    *,
    device: str = "cpu",
    poll: float = POLL_SECONDS,
    audit: Path | None = None,
) -> Follower:
    """`audit`: a folder for an auditor's FP32 replica; the follower then holds only verified states."""
    warn_if_validator_key(identity, peer, "follower")
    weights = Auditor(setup, peer, events, audit, task.initial_master, poll=2 * poll) if audit else None
    return Follower(peer, events, round_services(task, identity, peer, events, device), poll=poll, weights=weights)


def warn_if_validator_key(identity: Identity, peer: Peer, role: str) -> None:
    """A miner or follower that signs with one of the run's validator keys: almost always the
    validator's key file used by mistake (two nodes on one machine, one default key path). It runs,
    but everything it signs is signed as that validator."""
    if identity.public_hex in peer.run.validators:
        log.warning(
            "this %s signs with %s..., one of the run's VALIDATOR keys: give it its own key file "
            "(`pulse keygen --out miner.key`, then --key miner.key)",
            role,
            identity.public_hex[:16],
        )


# -- per task ------------------------------------------------------------------------------------


@singledispatch
def round_hooks(task: Task, peer: Peer, events: Events, poll: float, device: str) -> RoundHooks:
    raise NotImplementedError(f"no validator round hooks for task {task.kind!r}")


@round_hooks.register
def _(task: LMTask, peer: Peer, events: Events, poll: float, device: str) -> RoundHooks:
    held_out = [(x.to(device), y.to(device)) for x, y in task.held_out()]
    return HeldOutLoss(task.setup.new_model(initial=False).to(device), held_out)  # loads W before measuring


@round_hooks.register
def _(task: RLTask, peer: Peer, events: Events, poll: float, device: str) -> RoundHooks:
    return RLRoundHooks(task, peer, events, task.setup.new_model(), poll=poll)  # small models: the CPU


@singledispatch
def takes_over(task: Task) -> bool:
    """Whether a standby may close a round another validator opened: an RL round's rollout pool is the
    opener's (a standby would need it to score), so RL standbys audit and do not take rounds over."""
    return True


@takes_over.register
def _(task: RLTask) -> bool:
    return False


@singledispatch
def trainer_and_inputs(task: Task, identity: Identity, peer: Peer, device: str) -> tuple[Trainer, RoundInputs]:
    return task.trainer(identity, device), RoundInputs()  # nothing to fetch before training (language modelling)


@trainer_and_inputs.register
def _(task: RLTask, identity: Identity, peer: Peer, device: str) -> tuple[Trainer, RoundInputs]:
    trainer = task.trainer(identity, device)
    return trainer, PoolInputs(peer, trainer)


@singledispatch
def round_services(task: Task, identity: Identity, peer: Peer, events: Events, device: str) -> list[RoundService]:
    return []  # a language modelling follower serves nothing per round


@round_services.register
def _(task: RLTask, identity: Identity, peer: Peer, events: Events, device: str) -> list[RoundService]:
    return [RolloutWorker(task.setup, identity, peer, events, device)]
