"""The inference worker of an RL run: a follower's round service that generates, scores and publishes rollouts.

Once it holds W_r (bit-identical, via PULSESync), the worker samples G completions for each of
the prompts derived from (run id, r, its key), scores them with the task's reward, and publishes
the batch as a blob plus a signed `RolloutAnnouncement` tagged with the state hash it generated
from. It pushes both to the round's validators (`roles/rl/intake.py` seats them; a busy validator
is asked again for `pool_wait_seconds`), then stores the announcement in the DHT too, where a
validator that did not take the push may still find and fetch it. It re-serves the batches of the
last `max_staleness + 1` rounds (miners may train on them that long) and deletes older ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import torch

from node.events import Events, mb
from node.events.models import Missed, RolloutsPublished
from node.learn.rl.checks import announce
from node.learn.rl.generate import rollout_groups, rollout_seed
from node.learn.rl.task import problems_for
from node.learn.train import load_bf16_state
from node.net.peer import Peer
from node.roles.catchup import Held
from node.run.setup import RunSetup
from protocol import rollouts
from protocol.errors import NetworkError
from protocol.identity import Identity
from protocol.rollouts import RolloutBatch
from protocol.signing import SignedMessage

log = logging.getLogger(__name__)


class RolloutWorker:
    def __init__(self, setup: RunSetup, identity: Identity, peer: Peer, events: Events, device: str = "cpu") -> None:
        self.setup, self.identity, self.peer, self.events = setup, identity, peer, events
        self.cfg = setup.manifest.rl
        self.device = torch.device(device)
        self.model = setup.new_model().to(self.device).eval()
        self.published: list[tuple[int, str]] = []  # (round, blob sha), oldest first

    async def serve(self, held: Held) -> None:
        """Generate and publish this worker's batch for `held.round`, once per round."""
        if self.published and self.published[-1][0] >= held.round:
            return
        batch = await asyncio.get_running_loop().run_in_executor(None, self.generate, held)
        data = rollouts.encode(batch)
        sha = self.peer.store.put(data)
        self.peer.hold(sha, held.round, "other")
        self.published.append((held.round, sha))
        self._drop_old(held.round)
        signed = self.peer.sign(announce(batch, data))
        await self.peer.heartbeat(held.round, held.state_hash)  # lists the new blob, so miners find a holder
        pushed = await push_batch(self.peer, held.round, signed, self.peer.store.path(sha), self.cfg.pool_wait_seconds)
        try:
            await self.peer.publish_signed(signed.to_bytes())
        except NetworkError as exc:
            if not pushed:
                self.events.emit(
                    Missed(round=held.round, reason=str(exc)), f"round {held.round}: rollouts not announced: {exc}"
                )
                return
            log.info("round %d: rollouts pushed, but not stored in the DHT: %s", held.round, exc)
        self.events.emit(
            RolloutsPublished(
                round=held.round,
                completions=batch.completions,
                bytes=len(data),
                mean_reward=batch.mean_reward,
                pushed=pushed,
            ),
            f"round {held.round}: published {batch.completions} rollouts ({mb(len(data))}), "
            f"mean reward {batch.mean_reward:.3f}{'' if pushed else ' (announced only: no validator took the push)'}",
        )

    def generate(self, held: Held) -> RolloutBatch:
        me, run_id = self.identity.public_hex, self.setup.run_id
        load_bf16_state(self.model, held.weights)
        prompts = problems_for(run_id, held.round, me, self.cfg.prompts_per_batch, self.cfg)
        groups = rollout_groups(self.model, prompts, self.cfg, rollout_seed(run_id, held.round, me))
        return RolloutBatch(run_id, held.round, me, held.state_hash, tuple(groups))

    def _drop_old(self, round_: int) -> None:
        keep_from = round_ - self.cfg.max_staleness
        while self.published and self.published[0][0] < keep_from:
            _, sha = self.published.pop(0)
            self.peer.store.remove(sha)


async def push_batch(peer: Peer, round_: int, signed: SignedMessage, path: Path, wait: float) -> bool:
    """Push a signed rollout announcement and its batch (at `path`) to the validators of `round_` (or
    of the round before, while none has announced `round_` yet), a busy one again for `wait` seconds;
    True if one took it."""
    beats = await peer.validator_heartbeats(round_)
    if not beats and round_ > 0:
        beats = await peer.validator_heartbeats(round_ - 1)
    deadline = time.time() + wait
    validators = [(v, deadline) for v in dict.fromkeys(b.message.peer_id for b in beats)]
    failures = await peer.submit_to_each(signed, path, validators)
    for validator, why in failures:
        log.info("round %d: validator %s did not take the rollouts: %s", round_, validator, why)
    return len(failures) < len(validators)
