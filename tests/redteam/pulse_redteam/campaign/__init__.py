"""The attack and fault campaign: hostile miners and faults against a real loopback swarm.

- `attacks.py`   the attacks: what each sends, what must stop it, whether its payload gives it away
- `crafting.py`  hostile payloads and signed headers (pure; training attacks reuse `node.swarm.fakeminers`)
- `push.py`      the submit conversation on a libp2p stream, with lying, cut-off or trickled bodies
- `hostile.py`   the hostile miner process (`python -m pulse_redteam.campaign.hostile`)
- `fabricator.py` an RL worker process that publishes fabricated rollouts (`python -m ...campaign.fabricator`)
- `ledger.py`    one outcome per submission from the event logs: refused, rejected, scored or aggregated
- `swarms.py`    scenarios: swarms with hostile miners, and the faults, each checked by the ledger

`pulse bench attacks` (tests/redteam/pulse_redteam/bench/attacks.py) runs the full campaign from a source checkout; the
swarm tests in `tests/swarm/test_campaign.py` run a fast subset.
"""
