"""`pulse bench links --cpu-only`: the join's CPU phases, each timed, on the joiner's own code."""

from __future__ import annotations

import pytest

from node.bench import joincpu
from node.bench.links import _tables


def test_every_phase_is_timed_and_the_join_reaches_the_last_state() -> None:
    figures = joincpu.phases(2 << 20, patches=2, repeat=2)  # apply_patch raises if a state came out wrong
    seconds = figures["seconds"]
    assert list(seconds) == ["pieces", "commit", "load", "patch 0", "patch 1"]
    assert all(s > 0 for s in seconds.values())
    assert figures["after_download_seconds"] == pytest.approx(sum(seconds.values()) - seconds["pieces"])
    assert figures["seconds_per_gib"]["load"] == pytest.approx(seconds["load"] * 2**30 / figures["state_bytes"])
    assert _tables({"join_cpu": figures})
