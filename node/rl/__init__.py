"""RL post-training (`task = "rl"`): inference workers, GRPO miners, a validator that checks rewards.

- `config.py`      the manifest's `[rl]` section
"""
