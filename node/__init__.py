"""The running peer, in floors. Each floor imports only the floors below it (checked by
import-linter in `make test`, contracts in `pyproject.toml`); `node` may import `protocol` and
`validator`, neither imports `node`, and nothing imports `tests`.

From the top:

- `commands/`  the `pulse` CLI: parses flags and calls the floors below (`cli.py` is the entry point)
- `bench/`     `pulse bench ...`: benchmarks that print tables, or one JSON object with `--json`
- `swarm/`     local swarms of real processes (`pulse demo`), fake miners, the attack and fault campaign
- `roles/`     the roles on the network, each on a `Peer` it is given: follower, miner, validator
               service, catching up, the per-task pieces (RL pool, rollout worker), status
- `run/`       what a manifest means in memory: the manifest, the run's setup, the task object
               (W_0, evaluator, batches, trainer), the miner's local work
- `net/`       the network: signed records, blob store, streams, transfer, the `Peer` interface
               with its libp2p and in-memory implementations, key files
               (`run/` and `net/` are side by side and import neither each other)
- `learn/`     models, data, training and evaluation primitives, and the pure RL pieces
- `events/`    how each role reports: log lines, and one typed model per event kind as JSON lines

`python -m node` is `pulse`.
"""
