"""What a run means in memory: the manifest, the run's model and batches, a miner's local work.

Files (in import order):

- `manifest.py`   run manifests (`configs/*.toml`): pydantic sections, run id = hash of the manifest
- `presets.py`    where the shipped manifests are (a source checkout or an installed wheel)
- `setup.py`      `RunSetup`: the run's model, batches, held-out batches and W_0, from a manifest
- `trainer.py`    a miner's local work: H inner steps on its assignment, compression with error feedback

`run` imports `learn`, never `net`: the network layer gets the few facts it needs from the roles.
"""
