"""A miner's busy fraction: overlapping work counted once, work still running counted up to now."""

from __future__ import annotations

import pytest

from node.roles import miner
from node.roles.miner import BusyClock


def test_overlapping_work_counts_once_and_running_work_counts_until_now(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(miner.time, "monotonic", lambda: now[0])
    clock = BusyClock()
    assert clock.fraction() == 0.0
    train = clock.busy()
    train.__enter__()  # training from 100
    now[0] = 105.0
    with clock.busy():  # compressing 105..115 while training goes on until 110
        now[0] = 110.0
        train.__exit__(None, None, None)
        now[0] = 115.0
    now[0] = 120.0  # idle 115..120
    assert clock.fraction() == pytest.approx(15 / 20)
    with clock.busy():  # training ahead from 120, still running when the miner reports at 125
        now[0] = 125.0
        assert clock.fraction() == pytest.approx(20 / 25)
