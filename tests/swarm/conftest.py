"""Swarm tier: real libp2p daemons on 127.0.0.1 with OS-assigned ports, every process reaped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protocol.warmup import warm_up
from tests.swarm import procs


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One `$PULSE_CACHE_DIR` for the whole tier, inherited by every process it starts: the RL runs'
    warm-started W_0 (15-20 s of training on two cores) is made once, not once per test, and no test
    writes to the user's own cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PULSE_CACHE_DIR", str(tmp_path_factory.mktemp("pulse-cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def compiled_codecs(shared_cache: None) -> None:
    """Every codec kernel compiled (and cached on disk) before any node process starts, so that no
    node of a fresh checkout compiles one against a round's deadline."""
    warm_up()


@pytest.fixture(scope="module", autouse=True)
def reap_processes() -> Iterator[None]:
    """Set up before, torn down after, every other fixture of the module: nothing may outlive it.

    A process started by the module and still alive after its fixtures shut down is killed (by
    pid) and fails the module.
    """
    before = procs.descendants()
    yield
    started = {pid for pid in procs.descendants() - before if not procs.is_torch_shm_manager(pid)}
    survivors = procs.wait_gone(started, timeout=10.0)
    described = [procs.describe(pid) for pid in sorted(survivors)]
    procs.kill(survivors)
    assert not survivors, f"processes outlived their fixtures: {described}"
