"""pulse's red team: hostile miners, a lying validator and faults against real loopback swarms.

Not part of the product (protocol, validator and node never import it); installed beside pulse by
`make install`, which registers its benchmarks with `pulse bench` (entry-point group `pulse.bench`).

- `campaign/`   the attack and fault campaign: hostile miner processes, faults, the ledger
- `lying.py`    a lying `Validator` (adds, drops, scales, mismatched patch): the audit's test double
- `faults.py`   a validator process that tells one of those lies (`python -m pulse_redteam.faults`)
- `bench/`      `pulse bench attacks` (the campaign) and `pulse bench failover` (takeover and lies)
"""
