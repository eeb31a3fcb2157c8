"""How a swarm starts its roles' processes: in their own session, at the priority asked for."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from node.swarm.demo import _own_session

PRINT_NICE_AND_SESSION = "import os; print(os.nice(0), os.getsid(0) == os.getpid())"


@pytest.mark.parametrize("nice", [0, 10])
def test_a_role_runs_in_its_own_session_at_the_priority_asked_for(nice: int) -> None:
    """The attack campaign starts its hostile processes `nice` lower than the honest roles (they
    stand for attackers on other machines); every role leads its own session (a kill takes its
    children)."""
    mine = os.nice(0)
    out = subprocess.run(
        [sys.executable, "-c", PRINT_NICE_AND_SESSION],
        preexec_fn=_own_session(os.getpid(), nice),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [str(min(mine + nice, 19)), "True"]
