"""Shared fixtures. Fast in-process tests by default; `swarm`-marked tests start real peers.

- `round_harness`: makes a `Harness` (`tests/rounds.py`: whole runs of the real roles on the
  in-memory network) in a fresh folder, on one CPU thread; the test plays it and stops it.

Bounded waiting (`poll`, `apoll`, `wait_for`, `wait_exits`) and reading a swarm's event logs
(`events`, typed: `node.events.EventLog`) live in `tests/helpers.py`; the shared round setup (keys,
manifests, the harness) in `tests/rounds.py`. No test module imports another.
"""

from __future__ import annotations

import pytest
import torch

from node.run.manifest import Manifest
from tests.rounds import Harness, MakeHarness


@pytest.fixture(scope="session")
def round_harness(tmp_path_factory: pytest.TempPathFactory) -> MakeHarness:
    """`round_harness(name, manifest)`: a `Harness` for `manifest` in a new folder named after `name`."""

    def make(name: str, manifest: Manifest) -> Harness:
        torch.set_num_threads(1)  # in-process runs share a small machine with the rest of the suite
        return Harness(tmp_path_factory.mktemp(name), manifest)

    return make
