"""The RL parts of the roles (`task = "rl"`); the pure pieces are in `node/learn/rl/` and `node/run/`.

- `intake.py`      the validator's seats for rollout batches workers push (the Gauntlet's admission rules)
- `pool.py`        the validator's checked rollout pool of a round (the network side of `learn/rl/checks.py`)
- `worker.py`      the rollout worker: a follower's round service generating rollouts, pushing and announcing them
- `miner.py`       a GRPO miner's round inputs: the round's pool, fetched for its `RLTrainer`
- `validation.py`  `RLRoundHooks`: the pool before a round opens, the held-out reward after it closes
"""
