"""An RL run's rollout workers on the in-memory network, for the pool's tests."""

from __future__ import annotations

import hashlib
from pathlib import Path

from node.learn.rl.checks import announce
from node.net.memory import MemoryNetwork, MemoryPeer
from node.net.peer import RunRecords
from protocol import rollouts
from protocol.identity import Identity
from protocol.rollouts import RolloutBatch

RUN = hashlib.sha256(b"rl-run").hexdigest()
VALIDATOR = Identity.from_seed(hashlib.sha256(b"pulse-test-pool-validator").digest())


class Workers:
    """The validator's peer and the workers' peers on one in-memory network (records signature-checked)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.network = MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5))
        self.validator = self.network.join(VALIDATOR, root / "validator", role="validator")
        self.peers: dict[str, MemoryPeer] = {}

    async def publish(self, worker: Identity, batch: RolloutBatch, data: bytes | None = None) -> None:
        """What a worker does: hold the bytes, list them in a heartbeat, announce them (signed)."""
        peer = self.peers.get(worker.public_hex)
        if peer is None:
            peer = self.peers[worker.public_hex] = self.network.join(
                worker, self.root / worker.public_hex[:8], role="follower"
            )
        # a worker made this batch from W_r, so its node read the validator's result of round r-1:
        # the storages learn where the run is from such reads (records of far rounds are refused)
        self.network.budget.learn_head(max(batch.round - 1, 0))
        data = rollouts.encode(batch) if data is None else data
        peer.hold(peer.store.put(data), batch.round, "other")
        await peer.heartbeat(batch.round, batch.state_hash)
        await peer.publish(announce(batch, data))
