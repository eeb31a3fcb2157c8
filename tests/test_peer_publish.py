"""A DHT store that no peer took is retried before it is an error (a restarted validator's DHT
node may not know its neighbours yet; its round would otherwise stop there)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from node.commands.roles import DEFAULT_CONFIG
from node.net import peer as peer_mod
from node.net.peer import Peer
from node.roles.records import run_records
from node.run.manifest import load_manifest
from protocol.errors import NetworkError
from protocol.messages import Heartbeat


class FlakyDHT:
    """Refuses the first `failures` stores, as a DHT node without neighbours does."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def publish(self, message: Any, *, ttl: float) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise NetworkError(f"no peer stored {message.KIND} for round {message.round}")


def _beat(run_id: str) -> Heartbeat:
    return Heartbeat(run_id=run_id, round=5, role="validator", peer_id="1" * 46, state_hash=None, blobs=(), sent_at=1)


@pytest.mark.parametrize(("failures", "stored"), [(2, True), (3, False)])
def test_publish_retries_twice(monkeypatch: pytest.MonkeyPatch, failures: int, stored: bool) -> None:
    monkeypatch.setattr(peer_mod, "PUBLISH_RETRY_SECONDS", (0.01, 0.01))
    manifest = load_manifest(DEFAULT_CONFIG)
    dht = FlakyDHT(failures)
    peer = Peer(dht, None, None, None, run_records(manifest), "validator")  # type: ignore[arg-type]
    beat = _beat(manifest.run_id)
    if stored:
        asyncio.run(peer.publish(beat))
    else:
        with pytest.raises(NetworkError, match="no peer stored heartbeat"):
            asyncio.run(peer.publish(beat))
    assert dht.calls == min(failures + 1, 3)
