"""Shared fixtures. Fast in-process tests by default; `swarm`-marked tests start real peers.

Bounded waiting (`poll`, `apoll`, `wait_for`, `wait_exits`) and reading a swarm's event logs
(`events`, typed: `node.events.EventLog`) live in `tests/helpers.py`, imported by the tests that wait.
"""
