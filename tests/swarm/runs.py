"""A swarm test's run: keys made, a bootstrap up, every role stopped on the way out.

@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[tuple[Swarm, Path, list[Path]]]:
    with bootstrapped(tmp_path, _manifest(), miners=3, rounds=ROUNDS) as started:
        yield started            # (the swarm, the validator's key file, the miners' key files)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from node.run.manifest import Manifest
from node.swarm.demo import Swarm, prepare


@contextmanager
def bootstrapped(
    tmp_path: Path, manifest: Manifest, *, miners: int, rounds: int, standbys: int = 0
) -> Iterator[tuple[Swarm, Path, list[Path]]]:
    """The swarm of `manifest` (its validator, `standbys` more validators' and `miners` miner keys made
    under `tmp_path`: `prepare`) with its bootstrap started; `stop_all` however the test ends."""
    manifest, validator_key, miner_keys = prepare(tmp_path, manifest, miners, standbys)
    swarm = Swarm(tmp_path, manifest, rounds)
    try:
        swarm.start_bootstrap()
        yield swarm, validator_key, miner_keys
    finally:
        swarm.stop_all()
