"""Everything a node sends takes from one send budget: whole blobs, ranges and probes alike, a share
of it only for peers with standing; probes are signed, rate-limited per key and in total, and each
has an overall deadline. On the in-memory network (`node/net/memory.py`)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from node.net.memory import MemoryNetwork, MemoryPeer
from node.net.peer import RunRecords
from node.net.ranges import PROBE, RANGE, sign_probe
from node.net.streams import Status, Stream, TransferLimits, read_reply, send_request
from node.net.transfer import FETCH, fetch_request
from protocol.identity import Identity
from protocol.messages import Heartbeat

RUN = hashlib.sha256(b"pulse-test-send-budget").hexdigest()
VALIDATOR = Identity.generate()
BLOB = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(BLOB).hexdigest()
LIMITS = TransferLimits(max_fetch_streams=4, reserved_fetch_streams=2, open_timeout=5.0, chunk_timeout=5.0)


def network(limits: TransferLimits = LIMITS) -> MemoryNetwork:
    return MemoryNetwork(RunRecords(RUN, (VALIDATOR.public_hex,), 3600.0, 5), limits)


def holder(net: MemoryNetwork, tmp_path: Path, uplink: float = 64 * 1024) -> MemoryPeer:
    """The validator, holding `BLOB` behind a slow uplink (a fetch of it holds a send slot ~16 s)."""
    peer = net.join(VALIDATOR, tmp_path / "validator", role="validator")
    peer.store.put(BLOB)
    net.uplink[peer.peer_id] = uplink
    return peer


async def ask(stream: Stream, request: bytes) -> Status:
    reader, writer = stream
    await send_request(writer, request, LIMITS)
    status, _, _ = await read_reply(reader, 5.0)
    return status


@asynccontextmanager
async def sending(net: MemoryNetwork, target: str, n: int, prefix: str = "Sybil") -> AsyncIterator[list[Status]]:
    """`n` fetches of `BLOB` from fresh peer ids, each answered and then read by nobody while the block runs."""
    async with AsyncExitStack() as stack:
        answers = []
        for i in range(n):
            stream = await stack.enter_async_context(net.open(f"{prefix}{i}", target, FETCH))
            answers.append(await ask(stream, fetch_request(SHA, len(BLOB))))
        yield answers


async def one(net: MemoryNetwork, caller: str, target: str, request: bytes) -> Status:
    async with net.open(caller, target, FETCH) as stream:
        return await ask(stream, request)


def range_request(offset: int = 0, length: int = 4096) -> bytes:
    return RANGE.pack(b"R", bytes.fromhex(SHA), offset, length)


def test_ranges_and_probes_take_send_slots_that_fresh_ids_cannot_exhaust(tmp_path: Path) -> None:
    """Fresh ids hold every unreserved send slot: their ranges, probes and blobs are BUSY (before, ranges
    and probes were served past a full budget); a peer with standing still gets its range and blob."""
    net = network()

    async def main() -> dict[str, Status]:
        validator = holder(net, tmp_path)
        validator.service.standing.grant("Honest")
        async with sending(net, validator.peer_id, 2) as held:
            assert held == [Status.OK, Status.OK]
            return {
                "range": await one(net, "Fresh0", validator.peer_id, range_request()),
                "probe": await one(net, "Fresh1", validator.peer_id, sign_probe(Identity.generate(), RUN, b"P", 4096)),
                "blob": await one(net, "Fresh2", validator.peer_id, fetch_request(SHA, len(BLOB))),
                "standing range": await one(net, "Honest", validator.peer_id, range_request()),
                "standing blob": await one(net, "Honest", validator.peer_id, fetch_request(SHA, len(BLOB))),
            }

    got = asyncio.run(main())
    assert got == {
        "range": Status.BUSY,
        "probe": Status.BUSY,
        "blob": Status.BUSY,
        "standing range": Status.OK,
        "standing blob": Status.OK,
    }


def test_a_range_takes_a_send_slot_while_it_is_sent(tmp_path: Path) -> None:
    """With no reserve, a range being sent holds the only slot: the next fetch is BUSY."""
    net = network(TransferLimits(max_fetch_streams=1, reserved_fetch_streams=0, open_timeout=5.0))

    async def main() -> Status:
        validator = holder(net, tmp_path)
        async with net.open("Ranger", validator.peer_id, FETCH) as stream:
            assert await ask(stream, range_request(0, len(BLOB))) is Status.OK
            return await one(net, "Other", validator.peer_id, fetch_request(SHA, len(BLOB)))

    assert asyncio.run(main()) is Status.BUSY


def test_a_probe_must_be_signed_for_the_run(tmp_path: Path) -> None:
    net = network()

    async def main() -> list[Status]:
        validator = holder(net, tmp_path, uplink=1e9)
        me = Identity.generate()
        unsigned = PROBE.pack(b"P", 4096, 0, b"\0" * 32, b"\0" * 64)
        tampered = bytearray(sign_probe(me, RUN, b"P", 4096))
        tampered[8] ^= 1  # the length the key signed is not the one asked
        stale = PROBE.pack(b"P", 4096, int((time.time() - 3600) * 1000), me.public_key, b"\0" * 64)
        requests = [b"P" + (4096).to_bytes(8, "big"), unsigned, bytes(tampered), stale]
        requests.append(sign_probe(me, "another-run", b"P", 4096))
        requests.append(sign_probe(me, RUN, b"P", 4096))
        return [await one(net, f"Prober{i}", validator.peer_id, r) for i, r in enumerate(requests)]

    assert asyncio.run(main()) == [Status.REJECTED] * 5 + [Status.OK]


def test_probes_are_limited_per_key_and_in_total(tmp_path: Path) -> None:
    """One key: `probes_per_key_per_minute`, then BUSY. Fresh keys: the total byte budget for peers
    without standing, then BUSY; a peer with standing is still measured."""
    limits = LIMITS.model_copy(
        update={"probes_per_key_per_minute": 3, "unknown_probe_bytes_per_second": 64 * 1024, "max_fetch_streams": 16}
    )

    async def main() -> tuple[list[Status], list[Status], Status]:
        net = network(limits)
        validator = holder(net, tmp_path, uplink=1e9)
        validator.service.standing.grant("Honest")
        me = Identity.generate()
        per_key = [await one(net, "Prober", validator.peer_id, sign_probe(me, RUN, b"P", 1024)) for _ in range(4)]
        # the total: 16 s of 64 KiB/s saved up = 1 MiB, so the fifth 256 KiB probe of fresh keys is refused
        fresh = [
            await one(net, f"Fresh{i}", validator.peer_id, sign_probe(Identity.generate(), RUN, b"P", 256 << 10))
            for i in range(5)
        ]
        honest = await one(net, "Honest", validator.peer_id, sign_probe(Identity.generate(), RUN, b"P", 256 << 10))
        return per_key, fresh, honest

    per_key, fresh, honest = asyncio.run(main())
    assert per_key == [Status.OK] * 3 + [Status.BUSY]
    assert fresh == [Status.OK] * 3 + [Status.BUSY] * 2  # 3 KiB + 3 x 256 KiB spent of 1 MiB
    assert honest is Status.OK


def test_a_probe_has_an_overall_deadline(tmp_path: Path) -> None:
    """A reader that takes a little now and then (each read well within `chunk_timeout`) loses its
    probe at `max_probe_seconds`, and the send slot comes back."""
    limits = LIMITS.model_copy(update={"max_probe_seconds": 1.0, "max_fetch_streams": 1, "reserved_fetch_streams": 0})
    net = network(limits)

    async def main() -> tuple[float, Status]:
        validator = holder(net, tmp_path, uplink=256 << 10)  # 64 MiB would take 256 s
        validator.service.standing.grant("Slow")  # past the byte budget of peers without standing
        started = time.monotonic()
        async with net.open("Slow", validator.peer_id, FETCH) as stream:
            assert await ask(stream, sign_probe(Identity.generate(), RUN, b"P", 64 << 20)) is Status.OK
            reader, _ = stream
            while validator.service.fetches.used and time.monotonic() - started < 10:
                await reader.read(64 << 10)
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            return took, await one(net, "Next", validator.peer_id, range_request())

    took, after = asyncio.run(main())
    assert took < 4.0
    assert after is Status.OK


def test_a_node_grants_standing_to_the_validators_and_keys_with_standing(tmp_path: Path) -> None:
    """Heartbeats read by a node give standing to the peer ids the validators name, and to those of keys
    with standing (granted by a role, or aggregated in a round result it read); a fresh key's gives none."""
    net = network()

    async def main() -> tuple[bool, bool, bool]:
        validator = net.join(VALIDATOR, tmp_path / "validator", role="validator")
        miner = net.join(Identity.generate(), tmp_path / "miner", role="miner")
        sybil = net.join(Identity.generate(), tmp_path / "sybil", role="miner")
        for peer in (validator, miner, sybil):
            await peer.heartbeat(0, None)
        follower = net.join(Identity.generate(), tmp_path / "follower", role="follower")
        follower.grant_standing([miner.identity.public_hex])
        await follower.get(Heartbeat, 0)
        standing = follower.service.standing
        return validator.peer_id in standing, miner.peer_id in standing, sybil.peer_id in standing

    assert asyncio.run(main()) == (True, True, False)


def test_a_holder_that_delivered_gets_standing(tmp_path: Path) -> None:
    net = network()

    async def main() -> bool:
        validator = holder(net, tmp_path, uplink=1e9)
        validator.hold(SHA, 0)
        await validator.heartbeat(0, None)
        miner = net.join(Identity.generate(), tmp_path / "miner", role="miner")
        await miner.fetch(SHA, len(BLOB), 0)
        return validator.peer_id in miner.service.standing

    assert asyncio.run(main())


@pytest.mark.parametrize("length", [0, 1])
def test_a_probe_signature_covers_kind(tmp_path: Path, length: int) -> None:
    """A download probe's signature does not admit an upload probe."""
    net = network()

    async def main() -> Status:
        validator = holder(net, tmp_path, uplink=1e9)
        request = bytearray(sign_probe(Identity.generate(), RUN, b"P", length))
        request[0:1] = b"S"
        return await one(net, "Prober", validator.peer_id, bytes(request))

    assert asyncio.run(main()) is Status.REJECTED


def test_silent_streams_of_fresh_ids_leave_request_slots_for_peers_with_standing(tmp_path: Path) -> None:
    limits = LIMITS.model_copy(update={"max_requests": 8, "reserved_requests": 4, "request_timeout": 5.0})
    net = network(limits)

    async def main() -> tuple[Status, Status]:
        validator = holder(net, tmp_path, uplink=1e9)
        validator.service.standing.grant("Honest")
        async with AsyncExitStack() as stack:
            for i in range(4):  # silent: they never send their request
                await stack.enter_async_context(net.open(f"Silent{i}", validator.peer_id, FETCH))
            await asyncio.sleep(0.1)
            return (
                await one(net, "Fresh", validator.peer_id, range_request()),
                await one(net, "Honest", validator.peer_id, range_request()),
            )

    assert asyncio.run(main()) == (Status.BUSY, Status.OK)
