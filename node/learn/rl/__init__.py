"""The pure pieces of RL post-training (`task = "rl"`); the network roles are in `node/roles/rl/`.

- `config.py`      the manifest's `[rl]` section
- `task.py`        the verifiable task: addition prompts derived from (run id, round, worker key),
                   held-out prompts, the deterministic reward, checks of a peer's rollout groups
- `checks.py`      what a rollout batch must pass to be trained on (the validator and `pulse bench rl`)
- `generate.py`    batched seeded sampling of rollout groups (G per prompt) and greedy answers
- `provenance.py`  were a batch's completions sampled from the round's weights? (a surprisal z-test)
- `grpo.py`        group-relative advantages, the clipped surrogate (+ k3 KL), `GRPOTrainer`
- `evaluator.py`   `GRPOEvaluator` (loss = 1 - J, logp_old at the base), `PoolSource` (seed -> sample
                   of the round's pool), held-out reward
- `warmstart.py`   W_0: supervised steps on correct answers, cached as safetensors keyed by the recipe
"""
