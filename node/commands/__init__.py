"""The `pulse` CLI: each module parses one command's flags and calls the library.

A command declares its options once, as a pydantic model (`KeygenOptions`, `RoleOptions`, ...): its
flags and help are generated from it and the model validates them (`options.py`); the
`argparse.Namespace` stays in this package, the library gets the model or plain values.

- `options.py`    `add_options` / `options_from`: a model's fields as flags, the parsed flags as a model
- `argtypes.py`   types for those models (`Port`, `PositiveSeconds`, `KeyFile`), and flag types
- `cli.py`        the entry point; `COMMANDS` lists the commands in `--help` order, with the module
                  of each (only the module of the command being run is imported: `--help` is fast)
- `keygen.py`     `pulse keygen`
- `runid.py`      `pulse run-id --config`: the manifest's run id
- `dht.py`        `pulse dht`: a bootstrap peer that prints its multiaddrs
- `roles.py`      `pulse validator` (active or standby), `pulse miner`, `pulse follow [--audit]`, `pulse audit`
- `receipt.py`    `pulse receipt`: a miner's verdict in a round and its gains recomputed
- `demo.py`       `pulse demo`: the live table and report of `node/swarm/demorun.py`'s `run_demo`
- `status.py`     `pulse status`: current round, active nodes, latest scores
- `doctor.py`     `pulse doctor`: this machine and its links measured, and a forecast against the run
- `export.py`     `pulse export`: the model as a Hugging Face folder with its signed ledger; `--verify`
- `dashboard.py`  `pulse dashboard`: a live web page for the run
- `bench.py`      `pulse bench NAME`: registers the benchmarks of `node/bench/`
"""
