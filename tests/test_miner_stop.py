"""Ctrl+C while a miner trains: the training thread ends after the inner step it is in, so the
process exits in a step's time, not after the rest of its round (minutes at a real size)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node.roles.catchup import Held
from node.run.trainer import Stopped
from tests.test_fill_steps import miner, optimizer_steps

STEPS = 1000  # a round far longer than the test: finishing it is what a stuck Ctrl+C looks like


def test_a_trainer_told_to_stop_ends_after_its_current_step(tmp_path: Path) -> None:
    m, weights = miner(tmp_path, inner_steps=STEPS)
    trainer, drawn = m.trainer, []
    batch = trainer.batch

    def stop_at_the_second_batch(seed: int) -> object:
        drawn.append(seed)
        if len(drawn) == 2:
            trainer.stopping.set()
        return batch(seed)

    trainer.batch = stop_at_the_second_batch  # type: ignore[method-assign]
    with pytest.raises(Stopped):
        trainer.train(0, weights)
    assert optimizer_steps(m) == 2 and len(drawn) == 2


def test_ctrl_c_stops_a_miner_within_a_step_of_its_training(tmp_path: Path) -> None:
    m, weights = miner(tmp_path, inner_steps=STEPS)
    held = Held(0, weights, "0" * 64)

    async def sync() -> Held:
        return held

    async def mine(_: Held) -> None:
        await m._train(0, weights)

    m.chain.sync = sync  # type: ignore[method-assign]
    m._mine = mine  # type: ignore[method-assign]
    at_cancel = 0

    async def main() -> None:
        nonlocal at_cancel
        task = asyncio.ensure_future(m.run())
        while optimizer_steps(m) < 2:
            await asyncio.sleep(0.01)
        at_cancel = optimizer_steps(m)
        task.cancel()  # what Ctrl+C does (`commands.roles.until_signal`)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())  # returns once the training thread has ended (it waits for the executor)
    assert m.trainer.stopping.is_set()
    assert optimizer_steps(m) <= at_cancel + 2 < STEPS
