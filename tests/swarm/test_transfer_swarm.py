"""Blob streams between real libp2p daemons on loopback: fetch, submit, faults, re-serving.

Faulty servers run in their own process (`blob_peer.py`), so a test can SIGKILL one mid-transfer;
honest ones run in this process. Every test bounds its whole scenario with a timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop
from hivemind.p2p import P2P, PeerID

from node.net.blobstore import BlobStore
from node.net.dht import PulseDHT
from node.net.fetching import HolderBook
from node.net.netconfig import NetConfig
from node.net.records import RecordRules
from node.net.streams import DEFAULT_LIMITS, Status, TransferLimits, open_stream, read_reply, send_request
from node.net.transfer import (
    FETCH,
    NO_SUBMISSIONS,
    SUBMIT,
    Handlers,
    TransferService,
    call_fetch,
    call_submit,
    fetch_from_any,
)
from protocol.errors import (
    BlobHashMismatch,
    BlobNotFound,
    PeerBusy,
    SizeLimitExceeded,
    TransferError,
    TransferTimeout,
)
from protocol.identity import Identity
from protocol.messages import Heartbeat, SubmissionHeader
from protocol.signing import SignedMessage, Verified, sign
from tests.helpers import apoll
from tests.swarm import procs
from tests.swarm.blob_peer import Fault

pytestmark = [pytest.mark.swarm, pytest.mark.light]

RUN = hashlib.sha256(b"transfer-swarm-run").hexdigest()
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
REPO = Path(__file__).parents[2]
T = TypeVar("T")


def run(scenario: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    return uvloop.run(asyncio.wait_for(scenario, timeout))


async def poll(check: Callable[[], bool], timeout: float = 20.0) -> bool:
    return await apoll(check, timeout)


async def p2p_pair(*initial: list[str]) -> P2P:
    return await P2P.create(initial_peers=[a for group in initial for a in group], host_maddrs=LOOPBACK)


def blob(store: BlobStore, size: int) -> tuple[str, bytes]:
    data = os.urandom(size)
    return store.put(data), data


# -- peers in another process -------------------------------------------------------------------


@dataclass
class RemotePeer:
    proc: subprocess.Popen[str]
    pid: int  # the process that hosts the peer
    maddrs: list[str]
    p2pd_pid: int
    data: bytes

    @property
    def peer_id(self) -> PeerID:
        return PeerID.from_base58(self.maddrs[0].rsplit("/p2p/", 1)[1])

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def kill(self) -> None:
        """SIGKILL the hosting process and the peer's libp2p daemon: a machine that dies mid-transfer."""
        for pid in (self.pid, self.p2pd_pid):
            if procs.alive(pid):
                os.kill(pid, signal.SIGKILL)


def start_peers(root: Path, faults: list[Fault], data: bytes) -> dict[Fault, RemotePeer]:
    """One process hosting one peer per fault, all serving `data`; stop it with `stop_peers`."""
    BlobStore(root).put(data)
    cmd = [sys.executable, "-m", "tests.swarm.blob_peer", str(root), *(f.name for f in faults)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(_read_line(proc, timeout=60))
    except BaseException:
        stop_peers([proc])
        raise
    return {Fault[p["fault"]]: RemotePeer(proc, info["pid"], p["maddrs"], p["p2pd_pid"], data) for p in info["peers"]}


def stop_peers(processes: list[subprocess.Popen[str]]) -> None:
    for proc in processes:
        if proc.stdin is not None:
            proc.stdin.close()  # the polite stop
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # A killed host leaves its daemons orphaned: the module's reaper checks that none survive.


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Fault, RemotePeer]]:
    """Every kind of peer, in one separate process, each serving the same 4 MiB blob."""
    peers = start_peers(tmp_path_factory.mktemp("faulty"), list(Fault), os.urandom(4 << 20))
    try:
        yield peers
    finally:
        stop_peers([next(iter(peers.values())).proc])
        for peer in peers.values():
            procs.kill(procs.wait_gone({peer.p2pd_pid}, timeout=10))


@pytest.fixture
def doomed(tmp_path: Path) -> Iterator[RemotePeer]:
    """A stalling peer in a process of its own, for a test to SIGKILL."""
    peer = start_peers(tmp_path / "doomed", [Fault.STALL_HALF], os.urandom(16 << 20))[Fault.STALL_HALF]
    try:
        yield peer
    finally:
        stop_peers([peer.proc])
        procs.kill(procs.wait_gone({peer.p2pd_pid}, timeout=10))


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            proc.kill()
            raise TimeoutError("blob peer did not start")
    return proc.stdout.readline()


# -- fetch ---------------------------------------------------------------------------------------


def test_fetch_64_mib_verified(tmp_path: Path) -> None:
    server_store, client_store = BlobStore(tmp_path / "server"), BlobStore(tmp_path / "client")
    sha256, data = blob(server_store, 64 << 20)
    empty = server_store.put(b"")

    async def scenario() -> None:
        server = await p2p_pair()
        client = await p2p_pair(await _maddrs(server))
        await TransferService.create(server, server_store, run_id=RUN)
        try:
            path = await call_fetch(client, server.peer_id, sha256, client_store, max_size=64 << 20)
            assert path == client_store.path(sha256)
            assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256
            assert (await call_fetch(client, server.peer_id, empty, client_store, max_size=0)).read_bytes() == b""
            with pytest.raises(BlobNotFound):
                await call_fetch(client, server.peer_id, "0" * 64, client_store, max_size=1 << 20)
        finally:
            await client.shutdown()
            await server.shutdown()

    run(scenario())
    assert client_store.read(sha256) == data and client_store.partial_files() == []


def test_peer_killed_mid_transfer_is_a_clean_error(tmp_path: Path, doomed: RemotePeer) -> None:
    store = BlobStore(tmp_path / "client")
    limits = TransferLimits(batch_bytes=1 << 20, chunk_timeout=60)  # the kill, not a timeout, must end it

    async def scenario() -> None:
        client = await p2p_pair(doomed.maddrs)
        try:
            size = len(doomed.data)
            fetch = asyncio.create_task(
                call_fetch(client, doomed.peer_id, doomed.sha256, store, max_size=size, limits=limits)
            )
            assert await poll(lambda: any(p.stat().st_size > 0 for p in store.partial_files()))  # bytes are flowing
            doomed.kill()
            started = time.monotonic()
            with pytest.raises(TransferError) as info:
                await fetch
            assert not isinstance(info.value, TransferTimeout) and time.monotonic() - started < 15
        finally:
            await client.shutdown()

    run(scenario())
    assert not store.has(doomed.sha256) and store.partial_files() == []


def _fetch_from(
    peer: RemotePeer, store: BlobStore, *, max_size: int | None = None, limits: TransferLimits = DEFAULT_LIMITS
) -> float:
    """Fetch `peer`'s blob into `store` from a fresh client; returns the seconds it took."""

    async def scenario() -> float:
        client = await p2p_pair(peer.maddrs)
        started = time.monotonic()
        try:
            cap = len(peer.data) if max_size is None else max_size
            await call_fetch(client, peer.peer_id, peer.sha256, store, max_size=cap, limits=limits)
            return time.monotonic() - started
        finally:
            await client.shutdown()

    return run(scenario())


def test_stalled_peer_times_out(tmp_path: Path, faulty: dict[Fault, RemotePeer]) -> None:
    store = BlobStore(tmp_path / "client")
    with pytest.raises(TransferTimeout, match="stalled"):
        _fetch_from(faulty[Fault.STALL_HALF], store, limits=TransferLimits(chunk_timeout=1.0))
    assert list(store) == [] and store.partial_files() == []


def test_wrong_hash_is_discarded(tmp_path: Path, faulty: dict[Fault, RemotePeer]) -> None:
    store = BlobStore(tmp_path / "client")
    with pytest.raises(BlobHashMismatch):
        _fetch_from(faulty[Fault.WRONG_BYTES], store)
    assert list(store) == [] and store.partial_files() == []


def test_oversized_stream_is_refused_before_reading(tmp_path: Path, faulty: dict[Fault, RemotePeer]) -> None:
    store = BlobStore(tmp_path / "client")
    started = time.monotonic()
    with pytest.raises(SizeLimitExceeded, match="announced"):
        _fetch_from(faulty[Fault.HUGE_SIZE], store, max_size=64 << 20)
    assert time.monotonic() - started < 10  # it did not try to read a TiB
    assert list(store) == [] and store.partial_files() == []


def test_reader_stops_at_the_announced_size(tmp_path: Path, faulty: dict[Fault, RemotePeer]) -> None:
    peer = faulty[Fault.EXTRA_BYTES]
    store = BlobStore(tmp_path / "client")
    _fetch_from(peer, store)
    assert store.read(peer.sha256) == peer.data


def test_faulty_holders_are_raced_not_waited_out(tmp_path: Path, faulty: dict[Fault, RemotePeer]) -> None:
    """A stalling, a lying and a boasting holder beside an honest one: the blob arrives in seconds
    (one after another, the stall alone would cost the 30 s per-chunk timeout), and the next
    fetch asks the holder that delivered first."""
    bad = [Fault.STALL_HALF, Fault.WRONG_BYTES, Fault.HUGE_SIZE]
    honest = faulty[Fault.NONE]

    async def scenario() -> tuple[float, list[str]]:
        client = await p2p_pair(honest.maddrs)
        book = HolderBook()
        try:
            started = time.monotonic()
            peers = [faulty[f].peer_id for f in bad] + [honest.peer_id]
            await fetch_from_any(client, peers, honest.sha256, BlobStore(tmp_path / "c"), max_size=4 << 20, book=book)
            return time.monotonic() - started, book.order([p.to_base58() for p in peers])
        finally:
            await client.shutdown()

    seconds, order = run(scenario())
    assert seconds < 15.0
    assert order[0] == honest.peer_id.to_base58()


def test_fetch_from_a_separate_honest_process(tmp_path: Path, faulty: dict[Fault, RemotePeer]) -> None:
    peer = faulty[Fault.NONE]
    store = BlobStore(tmp_path / "client")
    _fetch_from(peer, store)
    assert store.read(peer.sha256) == peer.data
    with pytest.raises(TransferError, match="TOO_LARGE"):  # the server enforces the client's cap too
        _fetch_from(peer, BlobStore(tmp_path / "other"), max_size=1000)


# -- submit --------------------------------------------------------------------------------------


def _header(miner: Identity, payload: bytes, round_: int = 5, run_id: str = RUN) -> SignedMessage:
    header = SubmissionHeader(
        run_id=run_id,
        round=round_,
        base_state_hash="a" * 64,
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        payload_size=len(payload),
        codec="sparseloco",
        data_digest="b" * 64,
        sender=miner.public_hex,
    )
    return sign(miner, header)


def _taker(received: list[Verified[SubmissionHeader]]) -> Callable[[Verified[SubmissionHeader], Path], str | None]:
    def take(verified: Verified[SubmissionHeader], path: Path) -> str | None:
        received.append(verified)
        return None

    return take


def _accept_all(store: BlobStore) -> Handlers:
    """Every header seated; every body refused once here (these tests stop at the header or the stream)."""
    return Handlers(store, accept=lambda header: None, on_submission=lambda verified, path: NO_SUBMISSIONS)


def test_submit_push_replay_and_rejections(tmp_path: Path) -> None:
    validator_store = BlobStore(tmp_path / "validator")
    payload = os.urandom(3 << 20)
    payload_path = tmp_path / "payload.bin"
    payload_path.write_bytes(payload)
    miner = Identity.generate()
    received: list[Verified[SubmissionHeader]] = []

    def accept(header: SubmissionHeader) -> str | None:
        return "stale round" if header.round < 5 else None

    async def scenario() -> None:
        validator = await p2p_pair()
        miner_p2p = await p2p_pair(await _maddrs(validator))
        limits = TransferLimits(max_blob_bytes=4 << 20)
        await TransferService.create(
            validator,
            validator_store,
            run_id=RUN,
            limits=limits,
            intake=Handlers(validator_store, accept=accept, on_submission=_taker(received)),
        )
        try:
            signed = _header(miner, payload)
            assert await call_submit(miner_p2p, validator.peer_id, signed, payload_path) is True
            assert await call_submit(miner_p2p, validator.peer_id, signed, payload_path) is False  # replay: ignored
            with pytest.raises(TransferError, match="REJECTED stale round"):
                await call_submit(miner_p2p, validator.peer_id, _header(miner, payload, round_=4), payload_path)
            with pytest.raises(TransferError, match=r"REJECTED .*run"):
                other_run = _header(miner, payload, run_id="c" * 64)
                await call_submit(miner_p2p, validator.peer_id, other_run, payload_path)
            big = os.urandom(5 << 20)
            (tmp_path / "big.bin").write_bytes(big)
            with pytest.raises(TransferError, match="TOO_LARGE"):  # refused before any body byte is sent
                await call_submit(miner_p2p, validator.peer_id, _header(miner, big), tmp_path / "big.bin")
        finally:
            await miner_p2p.shutdown()
            await validator.shutdown()

    run(scenario())
    assert [v.message.payload_sha256 for v in received] == [hashlib.sha256(payload).hexdigest()]
    assert list(validator_store) == [hashlib.sha256(payload).hexdigest()]
    assert validator_store.partial_files() == []


def test_submit_with_a_lying_body_stores_nothing(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "validator")
    payload = os.urandom(1 << 20)
    signed = _header(Identity.generate(), payload)

    async def scenario() -> tuple[Status, str]:
        validator = await p2p_pair()
        miner = await p2p_pair(await _maddrs(validator))
        await TransferService.create(validator, store, run_id=RUN, intake=_accept_all(store))
        try:
            async with open_stream(miner, validator.peer_id, SUBMIT, DEFAULT_LIMITS) as (reader, writer):
                await send_request(writer, signed.to_bytes(), DEFAULT_LIMITS)
                assert (await read_reply(reader, 10))[0] is Status.OK
                writer.write(os.urandom(len(payload)))  # the right size, the wrong bytes
                status, _, reason = await read_reply(reader, 10)
                return status, reason
        finally:
            await miner.shutdown()
            await validator.shutdown()

    status, reason = run(scenario())
    assert status is Status.FAILED and "hashes to" in reason
    assert list(store) == [] and store.partial_files() == []


# -- serving limits and robustness ---------------------------------------------------------------


def test_stream_budgets_and_recovery(tmp_path: Path) -> None:
    """A stalled upload holds the only submission slot: another upload is BUSY, a fetch is not
    (separate budgets); the stall ends at the per-chunk timeout, with a reason, and frees the slot."""
    store = BlobStore(tmp_path / "server")
    sha256, _ = blob(store, 1 << 20)
    payload = os.urandom(1 << 20)
    limits = TransferLimits(max_submit_streams=1, reserved_submit_streams=0, chunk_timeout=1.0)

    async def scenario() -> None:
        server = await p2p_pair()
        client = await p2p_pair(await _maddrs(server))
        service = await TransferService.create(server, store, run_id=RUN, limits=limits, intake=_accept_all(store))
        try:
            async with open_stream(client, server.peer_id, SUBMIT, DEFAULT_LIMITS) as (reader, writer):
                await send_request(writer, _header(Identity.generate(), payload).to_bytes(), DEFAULT_LIMITS)
                assert (await read_reply(reader, 10))[0] is Status.OK
                with pytest.raises(PeerBusy):
                    other = tmp_path / "other.bin"
                    other.write_bytes(payload)
                    await call_submit(client, server.peer_id, _header(Identity.generate(), payload), other)
                await call_fetch(client, server.peer_id, sha256, BlobStore(tmp_path / "c1"), max_size=1 << 20)
                status, _, reason = await read_reply(reader, 10)
                assert status is Status.FAILED and "stalled" in reason
            assert await poll(lambda: service.active == 0, timeout=10)
            assert service.submits.used == 0 and service.fetches.used == 0
        finally:
            await client.shutdown()
            await server.shutdown()

    run(scenario())
    assert store.partial_files() == []


@pytest.mark.parametrize(
    "garbage", [b"", b"\x00\x00\x00\x05hello", b"\xff\xff\xff\xff", b"\x00\x00\x00\x29F" + b"x" * 40]
)
def test_garbage_requests_do_not_hurt_the_server(tmp_path: Path, garbage: bytes) -> None:
    store = BlobStore(tmp_path / "server")
    sha256, _ = blob(store, 1 << 16)

    async def scenario() -> None:
        server = await p2p_pair()
        client = await p2p_pair(await _maddrs(server))
        limits = TransferLimits(request_timeout=0.5)
        service = await TransferService.create(server, store, run_id=RUN, limits=limits, intake=_accept_all(store))
        try:
            for name in (FETCH, SUBMIT):
                async with open_stream(client, server.peer_id, name, DEFAULT_LIMITS) as (reader, writer):
                    writer.write(garbage)
                    await writer.drain()
                    if not garbage:
                        writer.write_eof()
                    await asyncio.wait_for(reader.read(), 10)  # the server answers or hangs up, never stalls
            assert await poll(lambda: service.active == 0, timeout=10)
            await call_fetch(client, server.peer_id, sha256, BlobStore(tmp_path / "c"), max_size=1 << 16)
        finally:
            await client.shutdown()
            await server.shutdown()

    run(scenario())


# -- re-serving: a blob spreads from every node that holds it -----------------------------------


def test_blob_is_reserved_by_every_holder(tmp_path: Path) -> None:
    nodes: list[PulseDHT] = []
    try:
        nodes.append(_dht_node(()))
        for _ in range(2):
            nodes.append(_dht_node(tuple(nodes[0].visible_maddrs())))
        run(_spread(nodes, tmp_path), timeout=90)
    finally:
        for node in nodes:
            node.shutdown()


def _dht_node(initial: tuple[str, ...]) -> PulseDHT:
    config = NetConfig(host_maddrs=tuple(LOOPBACK), initial_peers=initial, startup_timeout=20)
    return PulseDHT.start(config, RecordRules(RUN), Identity.generate())


async def _spread(nodes: list[PulseDHT], tmp_path: Path) -> None:
    author, relay, late = nodes
    stores = [BlobStore(tmp_path / f"node{i}") for i in range(3)]
    sha256, data = blob(stores[0], 4 << 20)
    p2ps = [await node.replicate_p2p() for node in nodes]
    services = [await TransferService.create(p2p, store, run_id=RUN) for p2p, store in zip(p2ps, stores, strict=True)]

    def announce(node: PulseDHT, store: BlobStore) -> None:
        beat = Heartbeat(
            run_id=RUN,
            round=1,
            role="follower",
            peer_id=node.peer_id.to_base58(),
            state_hash=None,
            blobs=tuple(store),
            sent_at=int(time.time()),
        )
        node.publish(beat, ttl=60)

    announce(author, stores[0])
    await _await_sync(lambda: relay.find_providers(1, sha256) == [author.peer_id])
    await fetch_from_any(p2ps[1], relay.find_providers(1, sha256), sha256, stores[1], max_size=len(data))
    announce(relay, stores[1])
    await services[0].shutdown()  # the author stops serving: only the relay has it now
    providers = await _await_sync(lambda: len(late.find_providers(1, sha256)) == 2 and late.find_providers(1, sha256))
    assert set(providers) == {author.peer_id, relay.peer_id}
    await fetch_from_any(p2ps[2], providers, sha256, stores[2], max_size=len(data))
    assert stores[2].read(sha256) == data


async def _await_sync(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll a blocking DHT check from async code without blocking the event loop."""
    return await apoll(check, timeout, interval=0.1, blocking=True)


async def _maddrs(p2p: P2P) -> list[str]:
    return [str(a) for a in await p2p.get_visible_maddrs()]
