"""Signed records on a real loopback DHT: 4 honest peers running our validator and 1 attacker.

The attacker is a plain `hivemind.DHT` without our validator, so it can push any record to the
honest peers; each case checks every honest peer's own storage, not just what a read returns.
Floods are made inside the attacker's DHT process (fresh keys, signed there), as an attacker
would; the honest peers run the run's `RecordRules` with a small heartbeat cap so a flood fills it.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
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

from node.net.dht import PulseDHT, dht_key, sign_for
from node.net.netconfig import NetConfig
from node.net.records import POLICIES, ROUND_WINDOW, RecordRules
from protocol.errors import NetworkError
from protocol.identity import Identity
from protocol.messages import (
    HEAD_ROUND,
    CheckpointAnnouncement,
    Heartbeat,
    Rejection,
    RoundResult,
    RunHead,
    SubmissionHeader,
)
from protocol.signing import SeenCache
from tests import helpers
from tests.helpers import commitments

pytestmark = [pytest.mark.swarm, pytest.mark.light]

RUN = hashlib.sha256(b"dht-swarm-run").hexdigest()
OTHER_RUN = hashlib.sha256(b"another-run").hexdigest()
VALIDATOR = Identity.from_seed(hashlib.sha256(b"dht-swarm-validator").digest())
HEARTBEAT_CAP = 8
RULES = RecordRules(
    RUN,
    (VALIDATOR.public_hex,),
    policies={**POLICIES, "heartbeat": replace(POLICIES["heartbeat"], max_signers=HEARTBEAT_CAP)},
)
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
        started.append(_peer((), VALIDATOR))  # honest[0] signs as the run's validator
        bootstrap = tuple(started[0].visible_maddrs())
        started += [_peer(bootstrap) for _ in range(3)]
        attacker = hivemind.DHT(initial_peers=list(bootstrap), host_maddrs=list(LOOPBACK), start=True)
        yield Swarm(started, attacker, Identity.generate())
    finally:
        if attacker is not None:
            attacker.shutdown()
        for peer in started:
            peer.shutdown()


def _peer(initial_peers: tuple[str, ...], identity: Identity | None = None) -> PulseDHT:
    config = NetConfig(host_maddrs=LOOPBACK, initial_peers=initial_peers, startup_timeout=20)
    return PulseDHT.start(config, RULES, identity or Identity.generate())


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


async def _stored_subkeys(_dht: hivemind.DHT, node: Any, key: str, where: tuple[str, ...]) -> list[Any]:
    """Runs inside a DHT process: the subkeys it holds for `key` (in its storage and cache)."""
    key_id = DHTID.generate(source=key)
    found: list[Any] = []
    for storage in (getattr(node.protocol, name) for name in where):
        item = storage.get(key_id)
        if item is None:
            continue
        if isinstance(item.value, DictionaryDHTValue):
            found += [subkey for subkey, _ in item.value.items()]
        else:
            found.append(None)  # a plain value without subkey
    return found


def stored_subkeys(dht: hivemind.DHT, key: str, where: tuple[str, ...] = ("storage", "cache")) -> list[Any]:
    coro = functools.partial(_stored_subkeys, key=key, where=where)
    return dht.run_coroutine(coro, return_future=True).result(timeout=10)


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


def test_a_store_counts_the_peers_other_than_the_writer_that_kept_it(swarm: Swarm) -> None:
    """An honest record is kept by other peers; one every other peer refuses (a key that takes itself
    for a validator signs a round result) is kept only by its writer and is not published: before,
    hivemind's answer or a read of the writer's own storage called it stored."""
    stored = swarm.honest[1].store_signed(sign_for(swarm.honest[1].identity, header(swarm.honest[1].identity, 40), 120))
    assert stored.others >= 1 and stored.published
    rogue_key = Identity.generate()
    config = NetConfig(host_maddrs=LOOPBACK, initial_peers=tuple(swarm.honest[0].visible_maddrs()), startup_timeout=20)
    rogue = PulseDHT.start(config, RecordRules(RUN, (rogue_key.public_hex,)), rogue_key)
    try:
        refused = rogue.store_signed(sign_for(rogue_key, result(41), 120))
        # only the attacker's plain hivemind node (it checks nothing) may keep it; no honest peer does
        assert refused.here and refused.others <= 1 < refused.asked
        key = dht_key(RUN, RoundResult.KIND, 41)
        assert all(rogue_key.public_key not in stored_subkeys(peer.dht, key) for peer in swarm.honest)
    finally:
        rogue.shutdown()


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
    RE_TIMED = "a valid record stored to live an hour longer than its signer said (pinning)"
    NOT_A_VALIDATOR = "a round result signed by a key that is not one of the run's validators"


def _attack(swarm: Swarm, fault: Fault, round_: int) -> tuple[str, Any]:
    """Store the faulty record from the attacker; returns (key, subkey) it used."""
    me = swarm.attacker_key
    message: Any = header(me, round_, run_id=OTHER_RUN if fault is Fault.OTHER_RUN else RUN)
    if fault is Fault.NOT_A_VALIDATOR:
        message = result(round_)
    signed = sign_for(me, message, 120)
    key = dht_key(signed.run_id, signed.kind, round_)
    subkey: Any = me.public_key
    value = signed.to_bytes()
    expiration = signed.expires_at
    pad_to = 0
    if fault is Fault.FORGED:
        value = replace(signed, signature=bytes(64)).to_bytes()
    elif fault is Fault.MIS_OWNED:
        subkey = swarm.honest[1].identity.public_key
    elif fault is Fault.WRONG_KEY:
        key = dht_key(RUN, signed.kind, round_ + 1000)
    elif fault is Fault.OVERSIZED:
        pad_to = 70 * 1024
    elif fault is Fault.UNSIGNED:
        subkey = None
    elif fault is Fault.FAR_EXPIRATION:
        expiration = get_dht_time() + 10 * 365 * 86400
    elif fault is Fault.RE_TIMED:
        expiration += 3600
    attacker_store(swarm.attacker, key, value, expiration, subkey, pad_to)
    return key, subkey


def result(round_: int, rejections: int = 0) -> RoundResult:
    return RoundResult(
        run_id=RUN,
        round=round_,
        selected=(),
        rejections=tuple(
            Rejection(sender=h(f"miner {i}"), payload_sha256=h(f"payload {i}"), reason=f"junk #{i}: " + "x" * 80)
            for i in range(rejections)
        ),
        base_state_hash=h(f"state {round_}"),
        patch_sha256=h(f"patch {round_}"),
        patch_size=1000,
        new_state_hash=h(f"state {round_ + 1}"),
        **commitments(str(round_)),
    )


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.name.lower())
def test_bad_records_are_rejected_by_every_peer(swarm: Swarm, fault: Fault) -> None:
    round_ = 100 + list(Fault).index(fault)
    if fault is Fault.NONE:  # the validator at this round: open records beyond its head + a few are refused
        swarm.honest[0].publish(beat(VALIDATOR, round_, "1" * 46), ttl=120)
    key, subkey = _attack(swarm, fault, round_)
    assert subkey in stored_subkeys(swarm.attacker, key)  # it really was created and pushed
    kind = RoundResult if fault is Fault.NOT_A_VALIDATOR else SubmissionHeader
    if fault is Fault.NONE:
        for peer in swarm.honest:
            assert poll(functools.partial(_holds, peer, key, subkey))
        assert [v.sender_hex for v in swarm.honest[0].get(kind, round_)] == [subkey.hex()]
        return
    for peer in swarm.honest:
        assert subkey not in stored_subkeys(peer.dht, key)
        assert peer.get(kind, round_) == []


def _holds(peer: PulseDHT, key: str, subkey: Any) -> bool:
    return subkey in stored_subkeys(peer.dht, key)


def test_replay_is_ignored(swarm: Swarm) -> None:
    author, reader = swarm.honest[1], swarm.honest[3]
    signed = author.publish(header(author.identity, round_=7), ttl=60)
    seen = SeenCache()
    assert [v.message_id for v in poll(lambda: reader.get_new(SubmissionHeader, 7, seen))] == [signed.message_id]
    # The attacker replays the same signed bytes: validly signed, so its own node stores them,
    # and a reader that remembers the id ignores them.
    attacker_store(swarm.attacker, dht_key(RUN, signed.kind, 7), signed.to_bytes(), signed.expires_at, signed.sender)
    assert reader.get_new(SubmissionHeader, 7, seen) == []
    assert [v.message_id for v in reader.get(SubmissionHeader, 7)] == [signed.message_id]


# -- floods and pinning: fresh keys flooding a round's records; an old record pinning out a newer one --


async def _flood_inside(_dht: hivemind.DHT, node: Any, kind: str, round_: int, n: int) -> int:
    """Runs inside the attacker's DHT process: `n` fresh keys each sign a `kind` record for
    `round_` and store it; how many stores some peer accepted."""
    from node.net.dht import dht_key, sign_for
    from protocol.identity import Identity
    from tests.swarm.test_dht_swarm import beat, result

    keys, values, expirations, subkeys = [], [], [], []
    for _ in range(n):
        me = Identity.generate()
        signed = sign_for(me, result(round_) if kind == "round_result" else beat(me, round_, "1" * 46), 600)
        keys.append(dht_key(RUN, kind, round_))
        values.append(signed.to_bytes())
        expirations.append(signed.expires_at)
        subkeys.append(me.public_key)
    stored = await node.store_many(keys, values, expirations, subkeys=subkeys)
    return sum(bool(ok) for ok in stored.values())


def flood(swarm: Swarm, kind: str, round_: int, n: int) -> int:
    coro = functools.partial(_flood_inside, kind=kind, round_=round_, n=n)
    return int(swarm.attacker.run_coroutine(coro, return_future=True).result(timeout=120))


def beat(me: Identity, round_: int, peer_id: str, sent_at: int = 1) -> Heartbeat:
    return Heartbeat(
        run_id=RUN, round=round_, role="validator", peer_id=peer_id, state_hash=None, blobs=(), sent_at=sent_at
    )


def test_a_flood_of_fresh_keys_cannot_hide_the_validators_result(swarm: Swarm) -> None:
    """250 round results signed by fresh keys for a predictable round, then the validator's."""
    flood(swarm, "round_result", 300, 250)
    swarm.honest[0].publish(result(300), ttl=120)
    key = dht_key(RUN, RoundResult.KIND, 300)
    for peer in swarm.honest:
        assert poll(lambda peer=peer: peer.get(RoundResult, 300))
        assert stored_subkeys(peer.dht, key) in ([], [VALIDATOR.public_key])  # no junk kept anywhere
        assert [v.sender_hex for v in peer.get(RoundResult, 300)] == [VALIDATOR.public_hex]


def test_a_heartbeat_flood_is_bounded_and_the_validators_heartbeat_kept(swarm: Swarm) -> None:
    flood(swarm, "heartbeat", 301, 5 * HEARTBEAT_CAP)
    validator = swarm.honest[0]
    validator.publish(beat(VALIDATOR, 301, validator.peer_id.to_base58()), ttl=120)
    key = dht_key(RUN, Heartbeat.KIND, 301)
    for peer in swarm.honest:
        assert len(stored_subkeys(peer.dht, key, ("storage",))) <= HEARTBEAT_CAP + 1
        found = poll(lambda peer=peer: [v for v in peer.get(Heartbeat, 301) if v.sender_hex == VALIDATOR.public_hex])
        assert found, "the validator's heartbeat was crowded out"


def test_an_owners_old_record_cannot_pin_out_its_newer_one(swarm: Swarm) -> None:
    """A restarted validator's new heartbeat for the same round wins everywhere, though an
    attacker re-stored the old one to live 23 hours longer."""
    validator, reader = swarm.honest[0], swarm.honest[2]
    old = validator.publish(beat(VALIDATOR, 302, validator.peer_id.to_base58(), sent_at=1), ttl=60)
    attacker_store(swarm.attacker, dht_key(RUN, old.kind, 302), old.to_bytes(), get_dht_time() + 23 * 3600, old.sender)
    time.sleep(1.1)  # the new record is signed a second later: it expires later
    validator.publish(beat(VALIDATOR, 302, validator.peer_id.to_base58(), sent_at=2), ttl=60)
    found = poll(lambda: [v.message.sent_at for v in reader.get(Heartbeat, 302)] == [2])
    assert found, [v.message.sent_at for v in reader.get(Heartbeat, 302)]


def test_large_values_do_not_kill_the_dht_process(swarm: Swarm) -> None:
    """A round result naming 128 rejections is ~35 KB: hivemind's pipe used to break on such stores."""
    validator = swarm.honest[0]
    for r in range(310, 334):  # it broke 1 time in 2 within 8 stores, nearly always within 24
        validator.publish(result(r, rejections=128), ttl=120)
        assert validator.alive
    assert len(poll(lambda: swarm.honest[3].get(RoundResult, 333))[0].message.rejections) == 128


async def _length(_: hivemind.DHT, __: object, blob: bytes) -> int:
    """Runs in the DHT process: the length of what the node sent it."""
    return len(blob)


def test_large_messages_sent_from_several_threads_at_once_do_not_kill_the_dht_process() -> None:
    """A node calls its DHT from whichever thread runs the call (`P2PPeer` runs them in a pool). Two
    large messages written into the DHT process's pipe at once interleaved, and the process died
    reading them ("invalid load key"): every call in flight was lost until it was restarted."""
    peer = _peer(())
    errors: list[str] = []

    def send(tag: int) -> None:
        for _ in range(40):
            try:
                call = functools.partial(_length, blob=bytes([tag]) * 200_000)
                assert peer.dht.run_coroutine(call, return_future=True).result(timeout=20) == 200_000
            except Exception as exc:  # the DHT process died: its futures fail or never finish
                errors.append(repr(exc))
                return

    try:
        threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and peer.alive, errors[:2]
    finally:
        peer.shutdown()


def test_a_dead_dht_process_is_restarted_with_its_identity(swarm: Swarm, tmp_path: Path) -> None:
    bootstrap = tuple(swarm.honest[1].visible_maddrs())
    config = NetConfig(host_maddrs=LOOPBACK, initial_peers=bootstrap, identity_path=tmp_path / "p2p.id")
    peer = PulseDHT.start(config, RULES, Identity.generate())
    try:
        before = peer.peer_id
        os.kill(peer.dht.pid, signal.SIGKILL)
        assert poll(lambda: not peer.alive)
        started = time.monotonic()
        with pytest.raises(NetworkError, match="stopped"):
            peer.get(SubmissionHeader, 320)
        assert time.monotonic() - started < 1.0  # no DHT timeout to wait out
        peer.restart()
        assert peer.alive and peer.peer_id == before
        message = header(peer.identity, 320)
        peer.publish(message, ttl=60)
        assert [v.message for v in poll(lambda: swarm.honest[2].get(SubmissionHeader, 320))] == [message]
    finally:
        peer.shutdown()


DIES_HOLDING_THE_LOCK = """
import json, multiprocessing as mp, os, sys, time
from hivemind.utils.mpfuture import MPFuture
from node.net import dht
from node.net.netconfig import NetConfig
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from tests.swarm.test_dht_swarm import LOOPBACK, RULES

dht.SHARED_LOCK_WAIT = 1.0
first = dht.PulseDHT.start(NetConfig(host_maddrs=LOOPBACK), RULES, Identity.generate())
# a process forked from this one dies inside the lock that guards every DHT process's replies,
# as a DHT process killed in the middle of one does
child = mp.get_context("fork").Process(target=lambda: (MPFuture._update_lock.acquire(), os._exit(0)))
child.start(); child.join()
started = time.monotonic()
second = dht.PulseDHT.start(NetConfig(host_maddrs=LOOPBACK, startup_timeout=10), RULES, Identity.generate())
print(json.dumps({"start_seconds": time.monotonic() - started, "first_answers": first.get(SubmissionHeader, 1) == []}))
second.shutdown(); first.shutdown()
"""


def test_a_dht_process_that_died_holding_a_shared_lock_hangs_no_other() -> None:
    """hivemind's DHT processes share the locks of the pipe they answer through. One killed inside
    such a lock used to leave every later DHT start of that node timing out ("could not start the
    DHT: ") and the running ones silent: a restart after an OOM kill never came back."""
    done = subprocess.run(
        [sys.executable, "-c", DIES_HOLDING_THE_LOCK],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["first_answers"] and found["start_seconds"] < 10
    assert "a dead DHT process held MPFuture._update_lock: released" in done.stderr


def _expiration(peer: PulseDHT, round_: int) -> float:
    found = peer.dht.get(dht_key(RUN, SubmissionHeader.KIND, round_), latest=True, return_future=True).result(10)
    return max((entry.expiration_time for entry in found.value.values()), default=0.0) if found else 0.0


def run_head(open_round: int) -> RunHead:
    checkpoint = CheckpointAnnouncement(
        run_id=RUN, round=0, state_hash=h("state"), blob_sha256=h("blob"), blob_size=1, format="safetensors"
    )
    return RunHead(
        run_id=RUN, round=HEAD_ROUND, open_round=open_round, state_hash=h("state"), checkpoint=checkpoint,
        validator_peer="1" * 46, sent_at=int(time.time()),
    )  # fmt: skip


def _beat(round_: int) -> Heartbeat:
    return Heartbeat(run_id=RUN, round=round_, role="miner", peer_id="1" * 46, state_hash=None, blobs=(), sent_at=1)


def test_a_storage_learns_the_head_from_what_its_node_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A storage learns the run's head only from validator records it is asked to store, so one that
    holds none knows no head: it takes the run's start for it (far rounds refused, the first rounds
    kept). Its node tells it the head it read: the rounds near that head are then kept and those
    beyond refused there, and a read of a validator's record is what tells it."""
    lone = _peer(())
    try:

        def kept_here(round_: int) -> bool:  # a fresh key each time: a refused record is not a stored owner
            sybil = Identity.generate()
            return lone.store_signed(sign_for(sybil, _beat(round_), 60)).here

        assert not kept_here(500) and kept_here(ROUND_WINDOW)  # no head known: the run's start
        assert not kept_here(3 + ROUND_WINDOW)
        lone.learn_head(3)
        assert poll(lambda: not kept_here(4 + ROUND_WINDOW))
        assert kept_here(3 + ROUND_WINDOW)
        told: list[int] = []
        real = lone.learn_head
        monkeypatch.setattr(lone, "learn_head", lambda r: (told.append(r), real(r)))
        assert lone.store_signed(sign_for(VALIDATOR, _beat(9), 60)).here  # the validator's, relayed
        assert [v.sender_hex for v in lone.get(Heartbeat, 9)] == [VALIDATOR.public_hex] and told == [9]
        lone.get(Heartbeat, 9)
        assert told == [9]  # told once per new head, not at every read
    finally:
        lone.shutdown()


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
        peer = PulseDHT.start(config, RULES, Identity.generate())
        try:
            peer_ids.append(peer.peer_id)
        finally:
            peer.shutdown()
    assert peer_ids[0] == peer_ids[1]


def test_libp2p_identity_file_is_private_from_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written 0600 from its first byte: with a permissive umask and no later chmod, it still is."""
    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)  # no tightening afterwards
    old = os.umask(0)
    try:
        peer = PulseDHT.start(
            NetConfig(host_maddrs=LOOPBACK, identity_path=tmp_path / "p2p.id"), RULES, Identity.generate()
        )
        peer.shutdown()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p2p.id").stat().st_mode) == 0o600


def test_unreachable_initial_peer_is_a_clear_error() -> None:
    dead = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWJDZW5oetBduTcnsaAHQat9C9sTKdmejTcWTReSBr8CHv"
    config = NetConfig(host_maddrs=LOOPBACK, initial_peers=(dead,), startup_timeout=5)
    with pytest.raises(NetworkError, match="initial peers"):
        PulseDHT.start(config, RULES, Identity.generate())


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
    cmd = [sys.executable, "-c", _DHT_CLI, "dht", "--run-id", RUN, "--validators", VALIDATOR.public_hex]
    cmd += ["--host", LOOPBACK[0]]
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

        def others_keep(round_: int) -> int:  # how many peers besides the writer keep a record of `round_`
            sybil = Identity.generate()
            return joined[0].store_signed(sign_for(sybil, _beat(round_), 60)).others

        message = header(joined[0].identity, round_=2)  # nobody knows the head yet: the run's start
        joined[0].publish(message, ttl=60)
        assert [v.message for v in poll(lambda: joined[1].get(SubmissionHeader, 2))] == [message]
        assert others_keep(1000) == 0 and others_keep(20) == 0  # far from the start: refused everywhere
        joined[0].store_signed(sign_for(VALIDATOR, run_head(open_round=20), 60))  # the validator's, relayed
        assert poll(lambda: joined[1].get(RunHead, HEAD_ROUND))  # this reader learns the head by reading it
        # the bootstrap reads the head on its own every few seconds: then both keep the head's rounds
        assert poll(lambda: others_keep(20) == 2, timeout=20)
        assert others_keep(1000) == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        for peer in joined:
            peer.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
