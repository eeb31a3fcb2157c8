"""What a rollout batch must pass before anyone trains on it: one rule for the validator and `pulse bench rl`.

    announcement = announce(batch, data)                 # what a worker signs for its encoded batch
    problem = oversize(announcement)                     # before fetching: the announced size
    found = vet(data, announcement, worker, run_id, states, cfg)   # a RolloutBatch, or why not

`vet` decodes with hard bounds (`LIMITS`), then checks (`check_batch`): the batch names the run,
round and worker of its announcement; it was generated from the validator's own state of that
round (`states`: round -> state hash); its prompts are exactly the ones (run id, round, worker key)
derive; G completions each, none too long; every claimed reward equals the recomputed one.
The validator's pool (`node/roles/rl/pool.py`) adds only the network: fetching, refusing, holding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from node.learn.rl.config import RLConfig
from node.learn.rl.task import problems_for, verify_groups
from protocol import rollouts
from protocol.errors import ProtocolError
from protocol.messages import RolloutAnnouncement
from protocol.rollouts import RolloutBatch, RolloutLimits

LIMITS = RolloutLimits()


def announce(batch: RolloutBatch, data: bytes) -> RolloutAnnouncement:
    """The announcement a worker signs for `batch`, encoded as `data`."""
    return RolloutAnnouncement(
        run_id=batch.run_id,
        round=batch.round,
        state_hash=batch.state_hash,
        blob_sha256=hashlib.sha256(data).hexdigest(),
        blob_size=len(data),
        groups=len(batch.groups),
        mean_reward=batch.mean_reward,
    )


def oversize(announced: RolloutAnnouncement) -> str | None:
    """Why the announced batch is not worth fetching (too big to be a batch), or None."""
    if announced.blob_size > LIMITS.max_batch_bytes:
        return f"batch of {announced.blob_size} bytes is over the cap"
    return None


def check_batch(
    batch: RolloutBatch,
    announced: RolloutAnnouncement,
    worker: str,
    run_id: str,
    states: Mapping[int, str],
    cfg: RLConfig,
) -> str | None:
    """Why `batch` (announced by `worker`) may not be trained on, or None if it may."""
    if batch.run_id != run_id or batch.round != announced.round or batch.worker != worker:
        return "batch names another run, round or worker than its announcement"
    known = states.get(batch.round)
    if known is None:
        return f"the validator keeps no state of round {batch.round}"
    if batch.state_hash != announced.state_hash or batch.state_hash != known:
        return f"generated from a state other than round {batch.round}'s"
    if len(batch.groups) != announced.groups:
        return "group count differs from the announcement"
    expected = problems_for(run_id, batch.round, worker, cfg.prompts_per_batch, cfg)
    return verify_groups(batch.groups, expected, cfg)


def vet(
    data: bytes,
    announced: RolloutAnnouncement,
    worker: str,
    run_id: str,
    states: Mapping[int, str],
    cfg: RLConfig,
) -> RolloutBatch | str:
    """The decoded batch when every check passes, else the reason it is refused."""
    problem = oversize(announced)
    if problem is not None:
        return problem
    try:
        batch = rollouts.decode(data, LIMITS)
    except ProtocolError as exc:
        return f"malformed batch: {exc}"
    return check_batch(batch, announced, worker, run_id, states, cfg) or batch
