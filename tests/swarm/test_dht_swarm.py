"""Signed records on a real loopback DHT: 4 honest peers running our validator and 1 attacker.

The attacker is a plain `hivemind.DHT` without our validator, so it can push any record to the
honest peers; each case checks every honest peer's own storage, not just what a read returns.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import hivemind
import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.utils.timed_storage import get_dht_time

from node.net.dht import PulseDHT, dht_key
from node.net.netconfig import NetConfig
from protocol.errors import NetworkError
from protocol.identity import Identity
from protocol.messages import Heartbeat, SubmissionHeader
from protocol.signing import SeenCache, sign
from tests import helpers

pytestmark = pytest.mark.swarm

RUN = hashlib.sha256(b"dht-swarm-run").hexdigest()
OTHER_RUN = hashlib.sha256(b"another-run").hexdigest()
LOOPBACK = ("/ip4/127.0.0.1/tcp/0",)
SETTLE_S = 10.0  # bound on how long a DHT store may take to become visible


@dataclass
class Swarm:
    honest: list[PulseDHT]
    attacker: hivemind.DHT
    attacker_key: Identity


@pytest.fixture(scope="module")
def swarm() -> Iterator[Swarm]:
    started: list[PulseDHT] = []
    attacker: hivemind.DHT | None = None
    try:
        started.append(_peer(()))
        bootstrap = tuple(started[0].visible_maddrs())
        started += [_peer(bootstrap) for _ in range(3)]
        attacker = hivemind.DHT(initial_peers=list(bootstrap), host_maddrs=list(LOOPBACK), start=True)
        yield Swarm(started, attacker, Identity.generate())
    finally:
        if attacker is not None:
            attacker.shutdown()
        for peer in started:
            peer.shutdown()


def _peer(initial_peers: tuple[str, ...]) -> PulseDHT:
    config = NetConfig(host_maddrs=LOOPBACK, initial_peers=initial_peers, startup_timeout=20)
    return PulseDHT.start(config, run_id=RUN, identity=Identity.generate())


def h(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


def header(identity: Identity, round_: int, run_id: str = RUN) -> SubmissionHeader:
    return SubmissionHeader(
        run_id=run_id,
        round=round_,
        base_state_hash=h("base"),
        payload_sha256=h(f"payload-{identity.public_hex}-{round_}"),
        payload_size=1000,
        codec="pulseloco",
        data_digest=h("data"),
        sender=identity.public_hex,
    )


def poll(check: Callable[[], Any], timeout: float = SETTLE_S) -> Any:
    """`check()` once it is truthy, or its last value after `timeout` (bounded polling)."""
    return helpers.poll(check, timeout)


async def _stored_subkeys(_dht: hivemind.DHT, node: Any, key: str) -> list[Any]:
    """Runs inside a DHT process: the subkeys it holds for `key` (storage and cache)."""
    key_id = DHTID.generate(source=key)
    found: list[Any] = []
    for storage in (node.protocol.storage, node.protocol.cache):
        item = storage.get(key_id)
        if item is None:
            continue
        if isinstance(item.value, DictionaryDHTValue):
            found += [subkey for subkey, _ in item.value.items()]
        else:
            found.append(None)  # a plain value without subkey
    return found


def stored_subkeys(dht: hivemind.DHT, key: str) -> list[Any]:
    return dht.run_coroutine(functools.partial(_stored_subkeys, key=key), return_future=True).result(timeout=10)


async def _store_inside(
    _dht: hivemind.DHT, node: Any, key: str, value: bytes, subkey: Any, expiration: float, pad_to: int
) -> bool:
    """Runs inside the attacker's DHT process. Large values are made there: hivemind's request
    pipe to its DHT process cannot carry a message near 64 KiB."""
    value = os.urandom(pad_to) if pad_to else value
    return bool(await node.store(key, value, expiration, subkey=subkey))


def attacker_store(dht: hivemind.DHT, key: str, value: bytes, expiration: float, subkey: Any, pad_to: int = 0) -> None:
    coro = functools.partial(_store_inside, key=key, value=value, subkey=subkey, expiration=expiration, pad_to=pad_to)
    dht.run_coroutine(coro, return_future=True).result(timeout=20)


# -- honest traffic ------------------------------------------------------------------------------


def test_signed_record_is_readable_by_all(swarm: Swarm) -> None:
    author = swarm.honest[1]
    message = header(author.identity, round_=1)
    author.publish(message, ttl=120)
    for reader in swarm.honest:
        found = poll(functools.partial(reader.get, SubmissionHeader, 1))
        assert [v.message for v in found] == [message]
        assert found[0].sender_hex == author.identity.public_hex


def test_many_senders_share_one_key(swarm: Swarm) -> None:
    for peer in swarm.honest:
        peer.publish(header(peer.identity, round_=2), ttl=120)
    found = poll(
        lambda: len(swarm.honest[0].get(SubmissionHeader, 2)) == 4 and swarm.honest[0].get(SubmissionHeader, 2)
    )
    assert {v.sender_hex for v in found} == {p.identity.public_hex for p in swarm.honest}


def test_heartbeats_find_blob_providers(swarm: Swarm) -> None:
    holder = swarm.honest[2]
    beat = Heartbeat(
        run_id=RUN,
        round=3,
        role="follower",
        peer_id=holder.peer_id.to_base58(),
        state_hash=None,
        blobs=(h("patch-3"),),
        sent_at=int(time.time()),
    )
    holder.publish(beat, ttl=120)
    assert poll(lambda: swarm.honest[0].find_providers(3, h("patch-3"))) == [holder.peer_id]
    assert swarm.honest[0].find_providers(3, h("other")) == []


# -- attacks -------------------------------------------------------------------------------------


class Fault(enum.Enum):
    NONE = "valid record (control: proves the attacker's path reaches the honest peers)"
    FORGED = "signature does not verify"
    MIS_OWNED = "valid signature, stored under someone else's subkey"
    OTHER_RUN = "validly signed for another run"
    WRONG_KEY = "valid message stored under another round's key"
    OVERSIZED = "value over 64 KiB"
    UNSIGNED = "plain value with no owner subkey"
    FAR_EXPIRATION = "expiration years ahead"


def _attack(swarm: Swarm, fault: Fault, round_: int) -> tuple[str, Any]:
    """Store the faulty record from the attacker; returns (key, subkey) it used."""
    me = swarm.attacker_key
    signed = sign(me, header(me, round_, run_id=OTHER_RUN if fault is Fault.OTHER_RUN else RUN))
    key = dht_key(signed.run_id, signed.kind, round_)
    subkey: Any = me.public_key
    value = signed.to_bytes()
    expiration = get_dht_time() + 120
    pad_to = 0
    if fault is Fault.FORGED:
        value = replace(signed, signature=bytes(64)).to_bytes()
    elif fault is Fault.MIS_OWNED:
        subkey = swarm.honest[0].identity.public_key
    elif fault is Fault.WRONG_KEY:
        key = dht_key(RUN, signed.kind, round_ + 1000)
    elif fault is Fault.OVERSIZED:
        pad_to = 70 * 1024
    elif fault is Fault.UNSIGNED:
        subkey = None
    elif fault is Fault.FAR_EXPIRATION:
        expiration = get_dht_time() + 10 * 365 * 86400
    attacker_store(swarm.attacker, key, value, expiration, subkey, pad_to)
    return key, subkey


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.name.lower())
def test_bad_records_are_rejected_by_every_peer(swarm: Swarm, fault: Fault) -> None:
    round_ = 100 + list(Fault).index(fault)
    key, subkey = _attack(swarm, fault, round_)
    assert subkey in stored_subkeys(swarm.attacker, key)  # it really was created and pushed
    if fault is Fault.NONE:
        for peer in swarm.honest:
            assert poll(functools.partial(_holds, peer, key, subkey))
        assert [v.sender_hex for v in swarm.honest[0].get(SubmissionHeader, round_)] == [subkey.hex()]
        return
    for peer in swarm.honest:
        assert subkey not in stored_subkeys(peer.dht, key)
        assert peer.get(SubmissionHeader, round_) == []


def _holds(peer: PulseDHT, key: str, subkey: Any) -> bool:
    return subkey in stored_subkeys(peer.dht, key)


def test_replay_is_ignored(swarm: Swarm) -> None:
    author, reader = swarm.honest[1], swarm.honest[3]
    signed = author.publish(header(author.identity, round_=7), ttl=60)
    seen = SeenCache()
    assert [v.message_id for v in poll(lambda: reader.get_new(SubmissionHeader, 7, seen))] == [signed.message_id]
    # The attacker replays the same signed bytes with a later expiration: validly signed, so
    # peers store it again, and a reader that remembers the id ignores it.
    attacker_store(swarm.attacker, dht_key(RUN, signed.kind, 7), signed.to_bytes(), get_dht_time() + 300, signed.sender)
    assert poll(lambda: _expiration(reader, 7) > get_dht_time() + 200)
    assert reader.get_new(SubmissionHeader, 7, seen) == []
    assert [v.message_id for v in reader.get(SubmissionHeader, 7)] == [signed.message_id]


def _expiration(peer: PulseDHT, round_: int) -> float:
    found = peer.dht.get(dht_key(RUN, SubmissionHeader.KIND, round_), latest=True, return_future=True).result(10)
    return max((entry.expiration_time for entry in found.value.values()), default=0.0) if found else 0.0


def test_records_of_unknown_kind_are_ignored_by_typed_reads(swarm: Swarm) -> None:
    author = swarm.honest[0]
    author.publish(header(author.identity, round_=9), ttl=60)
    assert poll(lambda: author.get(SubmissionHeader, 9))
    assert author.get(Heartbeat, 9) == []


# -- start-up ------------------------------------------------------------------------------------


def test_libp2p_identity_survives_restart(tmp_path: Path) -> None:
    config = NetConfig(host_maddrs=LOOPBACK, identity_path=tmp_path / "p2p.id")
    peer_ids = []
    for _ in range(2):
        peer = PulseDHT.start(config, run_id=RUN, identity=Identity.generate())
        try:
            peer_ids.append(peer.peer_id)
        finally:
            peer.shutdown()
    assert peer_ids[0] == peer_ids[1]


def test_unreachable_initial_peer_is_a_clear_error() -> None:
    dead = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWJDZW5oetBduTcnsaAHQat9C9sTKdmejTcWTReSBr8CHv"
    config = NetConfig(host_maddrs=LOOPBACK, initial_peers=(dead,), startup_timeout=5)
    with pytest.raises(NetworkError, match="initial peers"):
        PulseDHT.start(config, run_id=RUN, identity=Identity.generate())


_DHT_CLI = """
import argparse, sys
from node.commands import dht as dht_command
parser = argparse.ArgumentParser()
dht_command.register(parser.add_subparsers())
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def test_pulse_dht_command_serves_as_bootstrap(swarm: Swarm) -> None:
    # Only the `dht` command's parser, so the test does not depend on every command importing.
    cmd = [sys.executable, "-c", _DHT_CLI, "dht", "--run-id", RUN, "--host", LOOPBACK[0]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    joined: list[PulseDHT] = []
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (line := proc.stdout.readline()) and not line.startswith("ready"):
            lines.append(line.strip())
        maddrs = tuple(line for line in lines if line.startswith("/ip4/127.0.0.1/"))
        assert maddrs, lines
        joined += [_peer(maddrs), _peer(maddrs)]
        message = header(joined[0].identity, round_=11)
        joined[0].publish(message, ttl=60)
        assert [v.message for v in poll(lambda: joined[1].get(SubmissionHeader, 11))] == [message]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        for peer in joined:
            peer.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
