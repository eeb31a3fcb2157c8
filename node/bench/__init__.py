"""`pulse bench ...`: benchmarks. Each module exposes `configure(parser)` and `run(args) -> BenchResult`.

- `report.py`      what a benchmark returns: a JSON-able summary and the tables a person reads
- `trace.py`       real BF16 update traces from the base model (`load_trace`) and their sparsity
- `plainpatch.py`  the plain sparse patch encoding PULSESync is measured against
- `sync.py`        PULSESync size and speed against `plainpatch.py`
- `transfer.py`    blob fetch over libp2p versus a plain TCP copy
- `loco.py`        DDP, dense DiLoCo, SparseLoCo and PULSELoCo: loss and bytes
- `arena.py`       an in-process run of fake miners and a `Validator`
- `gauntlet.py`    the validator against fake miners: selection, loss, time and memory
- `rlsim.py`, `rl.py` decentralized GRPO with the real pieces (the miner's `RLTrainer`, the validator's
                   rollout checks) against single-process GRPO
- `attacks.py`     the attack and fault campaign (`node/swarm/campaign/`) against real loopback swarms
- `failover.py`    standby takeover after kills at five points of a round, and each lie against `--audit`
"""
