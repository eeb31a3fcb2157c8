"""The RL roles on the network (`task = "rl"`); the pure pieces are in `node/learn/rl/`.

- `pool.py`        the validator's checked rollout pool of a round
- `worker.py`      the follower as an inference worker: rollout batches from the weights it holds
- `miner.py`       the GRPO miner on its share of the pool
- `validation.py`  what the validator does differently in an RL run
"""
