"""A DHT store that no peer took is retried before it is an error (a restarted validator's DHT
node may not know its neighbours yet; its round would otherwise stop there)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from node.commands.roles import DEFAULT_CONFIG
from node.net import peer as peer_mod
from node.net.p2ppeer import P2PPeer
from node.roles.records import run_records
from node.run.manifest import load_manifest
from protocol.errors import NetworkError
from protocol.identity import Identity
from protocol.messages import Heartbeat


class FlakyDHT:
    """Refuses the first `failures` stores, as a DHT node without neighbours does."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def store_signed(self, signed: Any, *, expiration_time: float) -> bool:
        self.calls += 1
        return self.calls > self.failures


def _beat(run_id: str) -> Heartbeat:
    return Heartbeat(run_id=run_id, round=5, role="validator", peer_id="1" * 46, state_hash=None, blobs=(), sent_at=1)


@pytest.mark.parametrize(("failures", "stored"), [(2, True), (3, False)])
def test_publish_retries_twice(monkeypatch: pytest.MonkeyPatch, failures: int, stored: bool) -> None:
    monkeypatch.setattr(peer_mod, "PUBLISH_RETRY_SECONDS", (0.01, 0.01))
    manifest = load_manifest(DEFAULT_CONFIG)
    dht = FlakyDHT(failures)
    peer = P2PPeer(dht, None, None, None, run_records(manifest), Identity.generate(), "validator")  # type: ignore[arg-type]
    beat = _beat(manifest.run_id)
    if stored:
        asyncio.run(peer.publish(beat))
    else:
        with pytest.raises(NetworkError, match="no peer stored heartbeat"):
            asyncio.run(peer.publish(beat))
    assert dht.calls == min(failures + 1, 3)
