"""`train.fill_steps`: a miner training ahead goes on past H steps while the next state is not held,
up to the cap, and stops the moment it is; every other path trains exactly H."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import torch

from node.events import Events
from node.net.memory import MemoryNetwork
from node.roles.miner import Miner
from node.roles.records import run_records
from node.roles.tasks import miner_for
from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.identity import Identity
from protocol.state import State

H, FILL = 3, 5


def miner(folder: Path, **train: object) -> tuple[Miner, State]:
    validator = Identity.generate()
    fields = {"name": "fill", "validators": [validator.public_hex], "train": {"inner_steps": H, **train}}
    setup = RunSetup.from_manifest(Manifest.model_validate(fields))
    me = Identity.from_seed(hashlib.sha256(b"fill miner").digest())
    peer = MemoryNetwork(run_records(setup.manifest)).join(me, folder, role="miner")
    m = miner_for(setup, task_for(setup), me, peer, Events("miner"))
    weights = {k: v.to(torch.bfloat16) for k, v in task_for(setup).initial_master().items()}
    return m, weights


def optimizer_steps(m: Miner) -> int:
    state = m.trainer.optimizer.state  # type: ignore[attr-defined]
    return max((int(s["step"]) for s in list(state.values()) if "step" in s), default=0)


def test_training_fills_until_told_and_never_past_the_cap(tmp_path: Path) -> None:
    m, weights = miner(tmp_path, fill_steps=FILL)
    trainer = m.trainer
    trainer.train(0, weights)
    assert trainer.last_steps == H  # no `until`: H steps, as every path but training ahead
    asked: list[int] = []

    def until() -> bool:
        asked.append(1)
        return len(asked) > 2

    trainer.train(1, weights, until)
    assert trainer.last_steps == H + 2  # two more steps, then `until` said stop
    trainer.train(2, weights, lambda: False)
    assert trainer.last_steps == H + FILL and trainer.steps_done == H + (H + 2) + (H + FILL)


def test_without_fill_steps_until_changes_nothing(tmp_path: Path) -> None:
    m, weights = miner(tmp_path)
    m.trainer.train(0, weights, lambda: False)
    assert m.trainer.last_steps == H


def test_training_ahead_stops_filling_once_the_state_is_held(tmp_path: Path) -> None:
    """The ahead task of round 1 fills while W_1 is not held; entering round 1 stops it, and the time
    kept for "do H steps end in time?" is H steps' worth, not the filled run's."""
    m, weights = miner(tmp_path, fill_steps=100_000)

    async def main() -> None:
        ahead = m._start_ahead(1, weights)
        for _ in range(600):  # until the optimizer has taken more than H steps
            await asyncio.sleep(0.05)
            if optimizer_steps(m) > H:
                break
        assert optimizer_steps(m) > H and not ahead.task.done()  # filling: nothing holds W_1 yet
        ahead.stop.set()  # what `_mine` does once it holds W_1
        await asyncio.wait_for(ahead.task, 30)

    asyncio.run(main())
    seconds, steps = m.train_seconds[1]
    assert H < steps < H + 100_000 and m.trainer.last_steps == steps
    assert m.last_train_seconds is not None and abs(m.last_train_seconds - seconds * H / steps) < 1e-9
