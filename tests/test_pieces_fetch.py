"""A large blob from several holders at once (`node/net/pieces.py`), on the in-memory network with
rate-limited uplinks: work follows the holders' rates, a lying holder is dropped after its first bad
piece, a holder that leaves mid-transfer is replaced, a partial download resumes, nobody: a timeout."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from node.net import pieces
from node.net.memory import MemoryNetwork, MemoryPeer
from node.net.peer import RunRecords
from node.net.pieces import FetchProgress, Piece, PieceFetch, check_tiling, partial_path, resumable_bytes
from node.net.streams import Stream
from protocol.errors import TransferError, TransferTimeout
from protocol.identity import Identity

RUN = hashlib.sha256(b"pulse-test-pieces").hexdigest()
PIECE = 64 * 1024
SIZE = 40 * PIECE + 1234  # a short last piece


def pieces_of(data: bytes) -> list[Piece]:
    return [
        Piece(o, len(data[o : o + PIECE]), hashlib.sha256(data[o : o + PIECE]).digest())
        for o in range(0, len(data), PIECE)
    ]


def check(piece: Piece, data: bytes) -> bool:
    return hashlib.sha256(data).digest() == piece.digest


class Swarm:
    """A fetcher and holders of one blob; holders' uplinks in bytes/s."""

    def __init__(self, root: Path, rates: list[float], data: bytes | None = None) -> None:
        self.net = MemoryNetwork(RunRecords(RUN, frozenset(), 3600.0, 5))
        self.data = data if data is not None else os.urandom(SIZE)
        self.holders: list[MemoryPeer] = []
        for i, rate in enumerate(rates):
            peer = self.net.join(Identity.generate(), root / f"holder{i}", role="follower")
            self.sha = peer.store.put(self.data)
            self.net.uplink[peer.peer_id] = rate
            self.holders.append(peer)
        self.fetcher = self.net.join(Identity.generate(), root / "fetcher", role="follower")
        self.names = [h.peer_id for h in self.holders]

    def fetch(self, progress: list[FetchProgress] | None = None) -> PieceFetch:
        async def find() -> list[str]:
            return [n for n in self.names if n in self.net.peers]

        return PieceFetch(
            self.fetcher.store,
            self.sha,
            len(self.data),
            pieces_of(self.data),
            check,
            self.fetcher._open_fetch,
            find,
            on_progress=progress.append if progress is not None else None,
        )

    def run(self, fetch: PieceFetch, seconds: float) -> Path:
        """`fetch` by a deadline `seconds` away; then the holders' streams are let finish (their counts)."""

        async def main() -> Path:
            try:
                return await fetch.run(time.monotonic() + seconds)
            finally:
                await self.net.shutdown()

        return asyncio.run(main())

    def served(self) -> list[int]:
        return [h.service.counts.served_bytes for h in self.holders]


def test_pieces_come_from_every_holder_in_proportion_to_its_rate(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path, [2e6, 2e6, 0.5e6])
    progress: list[FetchProgress] = []
    start = time.monotonic()
    path = swarm.run(swarm.fetch(progress), 30)
    seconds = time.monotonic() - start
    assert path.read_bytes() == swarm.data
    served = swarm.served()
    assert all(s > 0 for s in served), served
    assert served[0] > 1.5 * served[2] and served[1] > 1.5 * served[2], served  # the slow one sends least
    assert seconds < SIZE / 2e6  # faster than the fastest holder alone
    # progress is sampled on a timer: a short transfer may be sampled while one holder is busy
    assert progress[-1].done == SIZE and max(p.holders for p in progress) >= 1
    assert not partial_path(swarm.fetcher.store, swarm.sha).exists()  # moved into blobs/


def test_a_holder_that_lies_is_dropped_and_the_blob_still_arrives(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path, [1e6, 1e6])
    liar = swarm.holders[0].store.path(swarm.sha)
    liar.chmod(0o644)
    liar.write_bytes(os.urandom(SIZE))  # same name, other bytes: every piece it sends is wrong
    fetch = swarm.fetch()
    path = swarm.run(fetch, 30)
    assert path.read_bytes() == swarm.data
    assert fetch.holders[swarm.names[0]].banned
    # banned on its first span: it sent at most one span per stream before that
    assert swarm.served()[0] < SIZE / 3


def test_a_holder_that_leaves_mid_transfer_is_replaced(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path, [1e6, 0.4e6])

    async def main() -> Path:
        fetch = swarm.fetch()
        task = asyncio.ensure_future(fetch.run(time.monotonic() + 60))
        while sum(swarm.served()) < SIZE // 4:
            await asyncio.sleep(0.01)
        swarm.net.leave(swarm.holders[0])  # the fast holder is gone: its open streams break
        for service_task in list(swarm.net._served):
            service_task.cancel()
        return await task

    path = asyncio.run(main())
    assert path.read_bytes() == swarm.data
    assert swarm.served()[1] > 0


def test_a_partial_download_resumes_where_it_stopped(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path, [1e6])

    async def stop_halfway() -> None:
        fetch = swarm.fetch()
        task = asyncio.ensure_future(fetch.run(time.monotonic() + 60))
        while len(fetch.done) < 20:
            await asyncio.sleep(0.01)
        task.cancel()  # as a killed process would: the pieces written so far stay on disk
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(stop_halfway())
    assert resumable_bytes(swarm.fetcher.store, swarm.sha) >= 20 * PIECE
    before = sum(swarm.served())
    fetch = swarm.fetch()
    path = swarm.run(fetch, 60)
    assert path.read_bytes() == swarm.data
    assert fetch.resumed >= 20 * PIECE
    assert sum(swarm.served()) - before <= SIZE - fetch.resumed + 2 * 4 * PIECE  # at most the endgame's copies


def test_a_corrupted_partial_piece_is_fetched_again(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path, [4e6])
    partial = partial_path(swarm.fetcher.store, swarm.sha)
    partial.parent.mkdir(parents=True)
    damaged = bytearray(swarm.data)
    damaged[3 * PIECE + 7] ^= 0xFF
    partial.write_bytes(bytes(damaged))
    fetch = swarm.fetch()
    path = asyncio.run(fetch.run(time.monotonic() + 30))
    assert path.read_bytes() == swarm.data
    assert fetch.resumed == SIZE - PIECE  # every piece but the damaged one was kept


def test_no_holder_means_a_timeout_naming_the_progress(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path, [1e6])
    swarm.names = []
    with pytest.raises(TransferTimeout, match="no holders found"):
        asyncio.run(swarm.fetch().run(time.monotonic() + 1.5))


def test_pieces_must_tile_the_blob() -> None:
    with pytest.raises(ValueError, match="tile"):
        check_tiling([Piece(0, 10, b""), Piece(11, 5, b"")], 16)
    with pytest.raises(ValueError, match="cover"):
        check_tiling([Piece(0, 10, b"")], 16)
    assert issubclass(TransferTimeout, TransferError)


def test_a_dead_holder_still_listed_is_dropped_with_backoff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder that died stays in the lookups (its last heartbeat outlives it): it is dropped after
    its failures and not asked again at every refresh, only once its backoff ends."""
    monkeypatch.setattr(pieces, "REFRESH_SECONDS", 0.05)  # a lookup every 50 ms: many chances to retry it
    swarm = Swarm(tmp_path, [1e6, 1e6])
    dead = swarm.names[0]
    swarm.net.leave(swarm.holders[0])
    opened: list[str] = []
    fetch = swarm.fetch()
    real_open = fetch.open_fetch

    def counting_open(holder: str) -> AbstractAsyncContextManager[Stream]:
        opened.append(holder)
        return real_open(holder)

    fetch.open_fetch = counting_open
    fetch.find_holders = lambda: _listed(swarm.names)  # the dead one too
    path = swarm.run(fetch, 30)
    assert path.read_bytes() == swarm.data
    # its streams' first tries and the strikes that drop it; never once per refresh (about 50 of them)
    assert opened.count(dead) <= pieces.STREAMS_PER_HOLDER + pieces.MAX_STRIKES, opened.count(dead)
    assert fetch.holders[dead].retry_at > time.monotonic() and fetch.holders[dead].drops == 1


def test_backoff_doubles_and_a_delivered_piece_resets_it(tmp_path: Path) -> None:
    holder = pieces._Holder("h")
    holder.strike(pieces.MAX_STRIKES)
    first = holder.retry_at - time.monotonic()
    holder.strikes = 0  # asked again after its backoff
    holder.strike(pieces.MAX_STRIKES)
    second = holder.retry_at - time.monotonic()
    assert first == pytest.approx(pieces.BACKOFF_SECONDS, abs=0.5) and second == pytest.approx(2 * first, abs=0.5)
    holder.strike(pieces.MAX_STRIKES)  # already dropped: no further doubling
    assert holder.drops == 2
    Swarm(tmp_path, [1e6]).fetch()._finished(holder, 0, 0.1)  # it delivered a piece after all
    assert holder.drops == 0 and holder.strikes == 0


async def _listed(names: list[str]) -> list[str]:
    return list(names)
