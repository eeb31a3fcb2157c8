"""What a run means in memory: the manifest, the run's model and batches, a miner's local work.

Files (in import order):

- `manifest.py`   run manifests (`configs/*.toml`): pydantic sections, run id = hash of the manifest
- `presets.py`    where the shipped manifests are (a source checkout or an installed wheel)
- `setup.py`      `RunSetup`: the run's model, batches and held-out batches, from a manifest
- `trainer.py`    a miner's local work: H inner steps (AdamW on its assignment, or GRPO on its pool
                  draw), compression with error feedback; the one honest miner step everything uses
- `hostmemory.py` a GPU node gives freed host blocks back at once (the codec's peak, not the heap's)
- `task.py`       the task as one object (`LMTask`, `RLTask`): W_0, the validator's evaluator and
                  batches, the miner's trainer

`run` imports `learn`, never `net`: the network layer gets the few facts it needs from the roles.
"""
