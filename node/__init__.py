"""The running peer, in floors. Each floor imports only the floors below it (checked by
import-linter in `make test`, contracts in `pyproject.toml`); `node` may import `protocol` and
`validator`, neither imports `node`, and nothing imports `tests`.

From the top:

- `commands/`  the `pulse` CLI: parses flags and calls the floors below (`cli.py` is the entry point)
- `bench/`     `pulse bench ...`: benchmarks that print tables, or one JSON object with `--json`
- `swarm/`     local swarms of real processes (`pulse demo`), fake miners, the attack and fault campaign
- `roles/`     the roles on the network: follower, miner, validator service, catching up, RL roles
- `run/`       what a manifest means in memory: the manifest, the run's setup, the miner's local work
- `net/`       libp2p and the DHT: signed records, blob store, streams, transfer, `Peer`, key files
               (`run/` and `net/` are side by side and import neither each other)
- `learn/`     models, data, training and evaluation primitives, and the pure RL pieces
- `events.py`  how each role reports: log lines plus the same events as JSON lines

`python -m node` is `pulse`.
"""
