"""Shared fixtures. Fast in-process tests by default; `swarm`-marked tests start real peers."""
