"""The `pulse` CLI: each module parses one command's flags and calls the library.

- `argtypes.py`   flag types that refuse bad numbers and paths at parse time, in one line
- `cli.py`        the entry point; `COMMANDS` lists the commands in `--help` order, with the module
                  of each (only the module of the command being run is imported: `--help` is fast)
- `keygen.py`     `pulse keygen`
- `runid.py`      `pulse run-id --config`: the manifest's run id
- `dht.py`        `pulse dht`: a bootstrap peer that prints its multiaddrs
- `roles.py`      `pulse validator` (active or standby), `pulse miner`, `pulse follow [--audit]`, `pulse audit`
- `receipt.py`    `pulse receipt`: a miner's verdict in a round and its gains recomputed
- `demo.py`       `pulse demo`: a loopback swarm, live table, report and plots
- `status.py`     `pulse status`: current round, active nodes, latest scores
- `doctor.py`     `pulse doctor`: this machine and its links measured, and a forecast against the run
- `export.py`     `pulse export`: the model as a Hugging Face folder with its signed ledger; `--verify`
- `dashboard.py`  `pulse dashboard`: a live web page for the run
- `bench.py`      `pulse bench NAME`: registers the benchmarks of `node/bench/`
"""
