"""RL post-training (`task = "rl"`): inference workers, GRPO miners, a validator that checks rewards.

- `config.py`      the manifest's `[rl]` section
- `task.py`        the verifiable task: addition prompts derived from (run id, round, worker key),
                   held-out prompts, the deterministic reward, checks of a peer's rollout groups
- `generate.py`    batched seeded sampling of rollout groups (G per prompt) and greedy answers
- `grpo.py`        group-relative advantages, the clipped surrogate (+ k3 KL), `GRPOTrainer`
- `evaluator.py`   `GRPOEvaluator` (loss = 1 - J, logp_old at the base), `PoolSource` (seed -> sample
                   of the round's pool), held-out reward
- `warmstart.py`   W_0: supervised steps on correct answers, cached as safetensors keyed by the recipe
- `pool.py`        the validator's checked rollout pool of a round (network)
- `worker.py`      the follower as an inference worker: rollout batches from the weights it holds
- `miner.py`       the GRPO miner on its share of the pool
- `validation.py`  what the validator does differently in an RL run

`task`, `generate`, `grpo`, `evaluator` and `warmstart` import neither the network nor the roles.
"""
