"""The tests' own waiting helpers: they return as soon as the condition holds and stop at the timeout."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.events import Events
from node.events.models import Training
from tests.helpers import apoll, events, poll, wait_exits, wait_for


def test_poll_returns_the_first_truthy_value_or_the_last_at_the_timeout() -> None:
    counter = itertools.count()
    assert poll(lambda: next(counter) >= 3 and "done", timeout=5, interval=0.001) == "done"
    started = time.monotonic()
    assert poll(lambda: [], timeout=0.2, interval=0.01) == []
    assert 0.2 <= time.monotonic() - started < 2


def test_apoll_from_async_code_also_with_a_blocking_check() -> None:
    counter = itertools.count()
    assert asyncio.run(apoll(lambda: next(counter) == 2, timeout=5, interval=0.001))
    assert asyncio.run(apoll(lambda: 0, timeout=0.1, blocking=True)) == 0


def test_wait_for_names_what_it_waited_for_and_the_logs(tmp_path: Path) -> None:
    wait_for(lambda: True, 1, "nothing")
    (tmp_path / "miner0.log").write_text("last words")
    with pytest.raises(AssertionError, match=r"the first patch.*miner0.log.*last words"):
        wait_for(lambda: False, 0.3, "the first patch", logs=tmp_path)


def test_wait_exits_shares_one_deadline() -> None:
    quick = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    wait_exits(quick, 30)
    assert [p.returncode for p in quick] == [0, 0]
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            wait_exits([slow], 0.5)
    finally:
        slow.kill()
        slow.wait()


def test_events_reads_a_swarms_logs_typed(tmp_path: Path) -> None:
    Events("miner", tmp_path / "events" / "miner0.jsonl").emit(Training(round=1, ahead=False), "training")
    log = events(tmp_path)
    assert log.has(Training, "miner0") and log.has(Training, "miner0", 1)
    assert not log.has(Training, "miner0", 2) and not log.has(Training, "validator")
