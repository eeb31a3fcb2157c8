"""The red team's benchmarks, found by `pulse bench` through the `pulse.bench` entry points.

- `attacks.py`   the attack and fault campaign (`pulse_redteam.campaign`) against real loopback swarms
- `failover.py`  standby takeover after kills at five points of a round, and each lie against `--audit`
"""
