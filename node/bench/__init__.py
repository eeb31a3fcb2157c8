"""`pulse bench ...`: benchmarks. Each module exposes `Options` (its options model) and `run(options) -> BenchResult`.

- `report.py`      what a benchmark returns: a JSON-able summary and the tables a person reads
- `peakmem.py`     the peak resident memory (and CUDA memory) of one phase of a benchmark
- `trace.py`       real BF16 update traces (the tiny base model, or a 0.5B model) and their sparsity
- `plainpatch.py`  the plain sparse patch encoding PULSESync is measured against
- `sync.py`        PULSESync size, speed and memory against `plainpatch.py`, on both traces
- `transfer.py`    blob fetch over libp2p versus a plain TCP copy
- `locospeed.py`   codec speed and memory at 0.5B, and the plain reference encoding of SparseLoCo's selection
- `loco.py`        DDP, dense DiLoCo, SparseLoCo and PULSELoCo: loss and bytes (`--speed`: locospeed.py)
- `arena.py`       an in-process run of fake miners and a `Validator`
- `gauntlet.py`    the validator against fake miners: selection, loss, time and memory
- `rlsim.py`, `rl.py` decentralized GRPO with the real pieces (the miner's `RLTrainer`, the validator's
                   rollout checks) against single-process GRPO
- `links.py`       joins, fetches, fixed vs adaptive deadlines, busy miners and `pulse doctor` on a shaped network
- `phases.py`      seconds and peak memory (host and CUDA) of named, nested phases; timing library steps
- `footprint.py`   what a miner holds, counted on its live tensors; activations kept for backward
- `memory.py`      the miner's memory options (BF16 moments, checkpointing, BF16 error feedback): loss, bytes
- `projection.py`  each role's memory at 1.5B, 7B, 72B from per-parameter and per-token measurements
- `scale.py`, `scalereport.py` a 0.5B-parameter architecture through whole rounds: each role's time and
                   memory, scaled to the home-GPU preset where the run is smaller, and the projection

`pulse bench attacks` and `pulse bench failover` (the red team, `tests/redteam/`) are found through
the `pulse.bench` entry points, beside these built-ins.
"""
