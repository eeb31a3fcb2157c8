"""Local swarms of real `pulse` processes, and the fake miners the Gauntlet is measured against.

- `demo.py`        `Swarm`: a bootstrap peer, a validator, miners and a follower as processes on
                   loopback, their event logs, the demo's summary and plots
- `demorun.py`     `run_demo(options)`: the swarm `pulse demo` runs, from its `DemoOptions` to its summary
- `netns.py`       `ShapedNetwork`: hosts in network namespaces behind one switch, `tc tbf` per link
- `frozenrun.py`   a run frozen on disk (checkpoint, piece index, patches, records) to serve and join
- `links.py`       joins, fetches and whole rounds on a shaped network (`pulse bench links`, swarm tier)
- `fakeminers.py`  in-process fake miners for the Gauntlet (the real miner's step), and one class per attack

The attack campaign, the lying validator and the faults are the red team, outside the product
(`tests/redteam/`).

`demo-loss-60.png` is the held-out loss of a 60-round `pulse demo`, shown in the README.
"""
