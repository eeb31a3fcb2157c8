"""The network side of an RL miner: the round's rollout pool, fetched for its `RLTrainer`.

In round r the miner reads the validator's signed `RolloutPool` for r and fetches its batches
from any holder (hash- and size-checked, decoded with hard bounds; a few kilobytes each). The
trainer (`node/run/trainer.py`, pure) then draws its groups with its assignment seeds
(`PoolSource`, the rule the validator scores it by) and trains H GRPO steps from W_r on them. The
validator has already checked every batch in the pool (rewards, prompts, state hash), so the miner
only decodes.
"""

from __future__ import annotations

import logging

from node.learn.rl.checks import LIMITS
from node.net.peer import Peer
from node.roles.miner import RoundInputs
from node.run.trainer import RLTrainer
from protocol import rollouts
from protocol.errors import ProtocolError, TransferError
from protocol.messages import RolloutPool
from protocol.rollouts import RolloutGroup

log = logging.getLogger(__name__)


async def fetch_pool(peer: Peer, round_: int) -> list[tuple[RolloutGroup, ...]] | None:
    """The groups of each batch of round `round_`'s pool, in pool order; None while it is not readable."""
    pool = await peer.from_validator(RolloutPool, round_)
    if pool is None:
        return None
    batches: list[tuple[RolloutGroup, ...]] = []
    for entry in pool.entries:
        try:
            path = await peer.fetch(entry.blob_sha256, entry.blob_size, entry.round)
            batches.append(rollouts.decode(path.read_bytes(), LIMITS).groups)
        except (TransferError, ProtocolError) as exc:
            log.info("round %d: rollout batch %s not usable yet: %s", round_, entry.blob_sha256[:12], exc)
            return None
    return batches


class PoolInputs(RoundInputs):
    """An RL miner's inputs: the round's pool, handed to its trainer once every batch is here."""

    def __init__(self, peer: Peer, trainer: RLTrainer) -> None:
        self.peer, self.trainer = peer, trainer

    async def ready(self, round_: int) -> bool:
        if self.trainer.has_pool(round_):
            return True
        batches = await fetch_pool(self.peer, round_)
        if batches is None:
            return False
        if not batches or not all(batches):  # a pool the validator would never publish: nothing to draw from
            log.warning("round %d: the pool names no rollout groups; not mining this round", round_)
            return False
        self.trainer.use_pool(round_, batches)
        return True
