"""A DHT store that no peer took is retried before it is an error (a restarted validator's DHT
node may not know its neighbours yet; its round would otherwise stop there), and a DHT process
that died is restarted rather than taking the node down."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hivemind.p2p import PeerID

from node.commands.roles import DEFAULT_CONFIG
from node.net import peer as peer_mod
from node.net.blobstore import BlobStore
from node.net.dht import Stored
from node.net.netconfig import NetConfig
from node.net.p2ppeer import P2PPeer
from node.net.transfer import FETCH, REPLICATE, SUBMIT, TransferService
from node.roles.records import run_records
from node.run.manifest import load_manifest
from protocol.errors import NetworkError
from protocol.identity import Identity
from protocol.messages import Heartbeat


class FlakyDHT:
    """Refuses the first `failures` stores, as a DHT node without neighbours does."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0
        self.alive, self.restarts = True, 0

    def store_signed(self, signed: Any) -> Stored:
        if not self.alive:
            raise NetworkError("the DHT process has stopped")
        self.calls += 1
        return Stored(others=int(self.calls > self.failures), here=True, asked=3)  # only the writer kept it

    def restart(self) -> None:
        self.alive, self.restarts = True, self.restarts + 1

    async def replicate_p2p(self) -> Any:
        return FakeDaemon(self.restarts)

    config = NetConfig()
    peer_id = PeerID.from_base58("12D3KooWJDZW5oetBduTcnsaAHQat9C9sTKdmejTcWTReSBr8CHv")


class FakeDaemon:
    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.handlers: list[str] = []

    async def add_binary_stream_handler(self, name: str, handler: Any) -> None:
        self.handlers.append(name)


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


def test_a_dead_dht_process_is_restarted_and_the_blob_service_registered_again(tmp_path: Path) -> None:
    """The validator's publish after its DHT process died (e.g. hivemind's pipe broke) goes through."""
    manifest = load_manifest(DEFAULT_CONFIG)
    dht = FlakyDHT(0)
    service = TransferService(None, BlobStore(tmp_path), run_id=manifest.run_id)
    peer = P2PPeer(dht, None, None, service, run_records(manifest), Identity.generate(), "validator")  # type: ignore[arg-type]
    dht.alive = False
    asyncio.run(peer.publish(_beat(manifest.run_id)))
    assert dht.restarts == 1 and dht.calls == 1
    assert isinstance(peer.p2p, FakeDaemon) and peer.p2p.generation == 1 and service.p2p is peer.p2p
    assert peer.p2p.handlers == [FETCH, SUBMIT, REPLICATE]
