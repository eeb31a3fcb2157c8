"""Blob-serving peers in their own process, honest or faulty, for the transfer swarm tests.

    python -m tests.swarm.blob_peer STORE_DIR FAULT [FAULT ...]

Starts one libp2p peer per FAULT, all serving the one blob in STORE_DIR. Prints one JSON line
(this process's pid; per peer its fault, multiaddrs and libp2p daemon pid), then serves until
stdin closes, or until it is killed: that is the point of running it in a separate process.
One process hosts several peers because starting Python with hivemind (and torch) is the
slowest part of these tests.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import sys
from pathlib import Path

import uvloop
from hivemind.p2p import P2P

from node.net.blobstore import BlobStore
from node.net.streams import DEFAULT_LIMITS, Status, hang_up, read_request, reply
from node.net.transfer import FETCH, TransferService

CHUNK = 1 << 20


class Fault(enum.Enum):
    NONE = "honest TransferService"
    STALL_HALF = "announces the real size, sends half, then goes silent"
    WRONG_BYTES = "sends the announced size, with one byte flipped"
    HUGE_SIZE = "announces 1 TiB, then sends data for as long as the reader takes it"
    EXTRA_BYTES = "sends the blob, then more bytes than announced"


async def main(root: Path, faults: list[Fault]) -> None:
    store = BlobStore(root)
    peers = [await _peer(store, fault) for fault in faults]
    info = {
        "pid": os.getpid(),
        "peers": [
            {
                "fault": fault.name,
                "maddrs": [str(a) for a in await p2p.get_visible_maddrs()],
                "p2pd_pid": p2p._child.pid,  # a test kills it too, to simulate a machine dying
            }
            for fault, p2p in zip(faults, peers, strict=True)
        ],
    }
    print(json.dumps(info), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin
    for p2p in peers:
        await p2p.shutdown()


async def _peer(store: BlobStore, fault: Fault) -> P2P:
    p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    if fault is Fault.NONE:
        await TransferService.create(p2p, store, run_id="0" * 64)
    else:
        await p2p.add_binary_stream_handler(FETCH, lambda _info, r, w: _faulty_fetch(store, fault, r, w))
    return p2p


async def _faulty_fetch(
    store: BlobStore, fault: Fault, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    await read_request(reader, DEFAULT_LIMITS)
    (sha256,) = list(store)
    data = bytearray(store.read(sha256))
    try:
        if fault is Fault.STALL_HALF:
            await reply(writer, Status.OK, size=len(data), limits=DEFAULT_LIMITS)
            writer.write(data[: len(data) // 2])
            await writer.drain()
            await asyncio.sleep(3600)
        elif fault is Fault.WRONG_BYTES:
            data[len(data) // 2] ^= 0xFF
            await reply(writer, Status.OK, size=len(data), limits=DEFAULT_LIMITS)
            writer.write(data)
            await writer.drain()
        elif fault is Fault.HUGE_SIZE:
            await reply(writer, Status.OK, size=2**40, limits=DEFAULT_LIMITS)
            while True:
                writer.write(data[:CHUNK])
                await writer.drain()
        elif fault is Fault.EXTRA_BYTES:
            await reply(writer, Status.OK, size=len(data), limits=DEFAULT_LIMITS)
            writer.write(data + os.urandom(CHUNK))
            await writer.drain()
    except ConnectionError:
        pass  # the reader hung up, as it should
    finally:
        await hang_up(reader, writer, timeout=10)


if __name__ == "__main__":
    uvloop.run(main(Path(sys.argv[1]), [Fault[name] for name in sys.argv[2:]]))
