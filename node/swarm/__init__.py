"""Local swarms of real `pulse` processes, and the adversaries they are tested against.

- `demo.py`        `Swarm`: a bootstrap peer, a validator, miners and a follower as processes on
                   loopback, their event logs, the demo's summary and plots
- `demorun.py`     `run_demo(options)`: the swarm `pulse demo` runs, from its `DemoOptions` to its summary
- `netns.py`       `ShapedNetwork`: hosts in network namespaces behind one switch, `tc tbf` per link
- `frozenrun.py`   a run frozen on disk (checkpoint, piece index, patches, records) to serve and join
- `links.py`       joins, fetches and whole rounds on a shaped network (`pulse bench links`, swarm tier)
- `fakeminers.py`  in-process fake miners for the Gauntlet (the real miner's step), and one class per attack
- `lying.py`       a lying `Validator` (adds, drops, scales, mismatched patch): the audit's test double
- `faults.py`      a validator process that tells one of those lies (`python -m node.swarm.faults`)
- `campaign/`      the attack and fault campaign: hostile miner processes, faults, the ledger
                   (`pulse bench attacks`, and the swarm tier's campaign test)

`demo-loss-60.png` is the held-out loss of a 60-round `pulse demo`, shown in the README.
"""
