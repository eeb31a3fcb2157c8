"""The roles on the network, built from a run (`run/`) and a peer (`net/`).

Files (in import order):

- `records.py`    the run as the network layer sees it (`RunRecords` from a manifest)
- `catchup.py`    BF16 global weights kept in step: patch chain, checkpoints to join or recover
- `miner.py`      the miner (train H steps, compress, push; overlaps the next round) and the follower
- `validator_service.py` the validator's rounds: open, collect pushed submissions, close, publish
- `rl/`           the RL roles: the workers' rollouts, the validator's pool, GRPO miners
- `export.py`     the model taken home: a Hugging Face folder, its contributor ledger and its check
- `dashboard/`    the live run page: a board derived from signed records, its HTML, a watcher, a server
"""
