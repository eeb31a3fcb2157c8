"""Blob transfer throughput: our verified fetch over libp2p versus a plain TCP socket copy.

A server process holds one random blob and serves it two ways: through `TransferService`
(hivemind P2P stream, TLS, yamux, two libp2p daemons in between) and through a plain loopback
TCP socket (`socket.sendfile`). The client, this process, fetches it each way `--repeats` times
and reports the median. Both clients write the blob to a file in the same folder; only ours also
hashes it, checks it and fsyncs it before the rename, since that is what a fetch must do.
A third row, the bare libp2p stream read into nothing, shows what the transport alone costs.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import socket
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import uvloop
from hivemind.p2p import P2P, PeerID
from pydantic import BaseModel, Field

from node.bench.report import BenchResult, table
from node.events import steps
from node.net.blobstore import BlobStore
from node.net.streams import DEFAULT_LIMITS, open_stream, read_reply, send_request
from node.net.transfer import FETCH, TransferService, call_fetch, fetch_request
from protocol.parsing import STRICT

RUN_ID = "0" * 64
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
READ_BYTES = 1 << 20


class Options(BaseModel):
    """`pulse bench transfer`'s options."""

    model_config = STRICT

    size_mib: int = Field(default=256, ge=1)
    """blob size in MiB"""
    repeats: int = Field(default=3, ge=1)
    """transfers per path; the median is reported"""
    dir: Path | None = None
    """work folder (default: a temp folder)"""


def run(options: Options) -> BenchResult:
    with tempfile.TemporaryDirectory(dir=options.dir, prefix="pulse-bench-transfer-") as tmp:
        return _measure(Path(tmp), options.size_mib << 20, options.repeats)


def _measure(root: Path, size: int, repeats: int) -> BenchResult:
    sha256 = _make_blob(BlobStore(root / "server"), size)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(root / "server", child), daemon=True)
    server.start()
    try:
        deadline = time.monotonic() + 60
        while not parent.poll(0.2):
            if not server.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the benchmark's server process failed to start")
        maddrs, port = parent.recv()
        client_store = BlobStore(root / "client")
        speeds = uvloop.run(_client(maddrs, port, sha256, size, client_store, repeats))
    finally:
        parent.send("stop")
        server.join(30)
        if server.is_alive():
            server.kill()
            server.join()
    return _report(size, repeats, speeds)


def _make_blob(store: BlobStore, size: int) -> str:
    return store.put(os.urandom(size))


async def _client(
    maddrs: list[str], port: int, sha256: str, size: int, store: BlobStore, repeats: int
) -> dict[str, list[float]]:
    p2p = await P2P.create(initial_peers=maddrs, host_maddrs=LOOPBACK)
    peer = PeerID.from_base58(maddrs[0].rsplit("/p2p/", 1)[1])
    speeds: dict[str, list[float]] = {"pulse": [], "stream": [], "raw": []}
    try:
        await call_fetch(p2p, peer, sha256, store, max_size=size)  # warm-up: connection, daemons, page cache
        store.remove(sha256)
        for _ in steps(range(repeats), "transfer repeats"):
            for path in speeds:
                start = time.perf_counter()
                if path == "pulse":
                    await call_fetch(p2p, peer, sha256, store, max_size=size)
                    store.remove(sha256)
                elif path == "stream":
                    await _bare_stream(p2p, peer, sha256, size)
                else:
                    await asyncio.get_running_loop().run_in_executor(None, _raw_copy, port, size, store.root)
                speeds[path].append(size / (time.perf_counter() - start) / 2**20)
    finally:
        await p2p.shutdown()
    return speeds


async def _bare_stream(p2p: P2P, peer: PeerID, sha256: str, size: int) -> None:
    """Our fetch conversation, with the body read into nothing: the transport's own speed."""
    async with open_stream(p2p, peer, FETCH, DEFAULT_LIMITS) as (reader, writer):
        await send_request(writer, fetch_request(sha256, size), DEFAULT_LIMITS)
        _, remaining, _ = await read_reply(reader, DEFAULT_LIMITS.open_timeout)
        while remaining:
            chunk = await reader.read(min(READ_BYTES, remaining))
            if not chunk:
                raise ConnectionError("server closed early")
            remaining -= len(chunk)


def _raw_copy(port: int, size: int, folder: Path) -> None:
    """A plain TCP copy into a file: recv_into one buffer, write it out. No hash, no fsync."""
    buf = bytearray(READ_BYTES)
    view = memoryview(buf)
    with socket.create_connection(("127.0.0.1", port)) as sock, (folder / "raw.tmp").open("wb") as out:
        remaining = size
        while remaining:
            n = sock.recv_into(view, min(READ_BYTES, remaining))
            if n == 0:
                raise ConnectionError("server closed early")
            out.write(view[:n])
            remaining -= n
    (folder / "raw.tmp").unlink()


def _report(size: int, repeats: int, speeds: dict[str, list[float]]) -> BenchResult:
    median = {path: statistics.median(values) for path, values in speeds.items()}
    summary: dict[str, Any] = {
        "libp2p_mib_s": round(median["pulse"], 1),
        "raw_mib_s": round(median["raw"], 1),
        "ratio": round(median["pulse"] / median["raw"], 3),
        "libp2p_stream_mib_s": round(median["stream"], 1),
        "size_mib": size >> 20,
        "repeats": repeats,
        "target_ratio": 0.5,
    }
    rows = [
        ["pulse fetch (libp2p stream, SHA-256 check, fsync, rename)", median["pulse"], median["pulse"] / median["raw"]],
        ["bare libp2p stream (read into nothing)", median["stream"], median["stream"] / median["raw"]],
        ["plain TCP socket copy (sendfile -> file)", median["raw"], 1.0],
    ]
    title = f"transfer: {size >> 20} MiB blob, loopback, median of {repeats}; target pulse >= 0.5x raw"
    return BenchResult(summary=summary, tables=[table(title, ["path", "MiB/s", "x raw"], rows)])


# -- the server process --------------------------------------------------------------------------


def _serve(root: Path, conn: Connection) -> None:
    logging.basicConfig(level=logging.WARNING, format="transfer bench server: %(name)s: %(message)s")
    logging.getLogger("node").setLevel(logging.INFO)  # a failed stream is logged at INFO: show why
    uvloop.run(_serve_async(BlobStore(root), conn))


async def _serve_async(store: BlobStore, conn: Connection) -> None:
    p2p = await P2P.create(host_maddrs=LOOPBACK)
    service = await TransferService.create(p2p, store, run_id=RUN_ID)
    listener = socket.create_server(("127.0.0.1", 0))
    loop = asyncio.get_running_loop()
    raw_task = loop.run_in_executor(None, _serve_raw, listener, store)
    try:
        conn.send(([str(a) for a in await p2p.get_visible_maddrs()], listener.getsockname()[1]))
        await loop.run_in_executor(None, conn.recv)  # "stop"
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        listener.close()
        await service.shutdown()
        await p2p.shutdown()
        await asyncio.wait([raw_task], timeout=5)


def _serve_raw(listener: socket.socket, store: BlobStore) -> None:
    """Send the store's one blob to every connection, until the listener is closed."""
    (sha256,) = list(store)
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        with sock, store.open(sha256) as f:
            sock.sendfile(f)
