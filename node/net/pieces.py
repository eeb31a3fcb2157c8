"""One large blob from several holders at once, piece by piece, each piece checked as it arrives.

    fetch = PieceFetch(store, sha256, size, pieces, check, open_fetch, find_holders, on_progress=show)
    path = await fetch.run(deadline)          # the whole blob, SHA-256-checked, in `store`

A joiner's checkpoint is the one blob large enough for this (about 1 GB at 0.5B parameters): its
piece list (offsets, lengths, digests: `protocol/pieces.py`) is known before the first byte, so
any holder can send any piece and a wrong piece is caught on its own, before it is written.

- spans: each holder is asked for runs of consecutive missing pieces (one range request,
  `ranges.py`), sized to about `SPAN_SECONDS` at the rate it has shown, `STREAMS_PER_HOLDER` at once
  so its link never idles between requests. Fast holders take more spans: the work follows the rates.
- endgame: once nothing is left to hand out, an idle holder also asks for the last half of the
  undone pieces of the slowest span still in flight; whichever copy arrives first is kept.
- failures: a piece that fails its check bans its holder for this blob (a holder that lies once is
  not asked again); a broken, stalled or refused stream gives its undone pieces back and the holder
  is dropped after `MAX_STRIKES` failures in a row, for `BACKOFF_SECONDS`, doubling each time it is
  dropped again (up to `MAX_BACKOFF_SECONDS`; a piece it delivers resets that). Holders are looked up
  again every `REFRESH_SECONDS` and whenever none is left, so a holder that died is replaced without
  starting over, and one that is still listed (its last heartbeat outlives it) is not asked again
  until its backoff ends; with nobody to ask for `NO_HOLDERS_SECONDS` the fetch gives up (the
  caller tries again later).
- resume: pieces are written in place into `pieces/<sha256>` under the store; after a restart, the
  pieces already there that pass their check are kept (only allocated regions are read), the rest
  fetched. When every piece is in, the file is fsynced and renamed into `blobs/`, not hashed whole
  again: the pieces tile the blob and each passed its digest, so the caller's digests must come
  from a list that names the blob's content (a checkpoint's piece index, which the validator's signed
  announcement names by its SHA-256 beside the blob's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from node.net.blobstore import BlobStore
from node.net.ranges import MAX_RANGE_BYTES, open_range
from node.net.streams import DEFAULT_LIMITS, Stream, TransferLimits
from protocol.errors import BlobHashMismatch, BlobNotFound, PeerBusy, ProtocolError, TransferError, TransferTimeout

log = logging.getLogger(__name__)

SPAN_SECONDS = 1.5  # a span takes about this long at its holder's rate
FIRST_SPAN_PIECES = 4  # before a holder has shown its rate
STREAMS_PER_HOLDER = 2
MAX_STRIKES = 2
BACKOFF_SECONDS = 15.0  # a dropped holder is not asked again for this long, doubled per drop
MAX_BACKOFF_SECONDS = 240.0
REFRESH_SECONDS = 10.0
STALL_SECONDS = 10.0  # a piece that does not finish arriving within this is a stalled holder
PROGRESS_SECONDS = 0.5
NO_HOLDERS_SECONDS = 30.0  # with nobody to ask for this long, give up (what arrived stays for a retry)
RATE_WINDOW_SECONDS = 5.0


@dataclass(frozen=True)
class Piece:
    """Bytes [offset, offset + length) of a blob, and what they must digest to."""

    offset: int
    length: int
    digest: bytes


Check = Callable[[Piece, bytes], bool]
"""Whether `data` is exactly `piece` (its digest matches)."""
OpenFetch = Callable[[str], AbstractAsyncContextManager[Stream]]
"""An open fetch stream to a holder (a peer id)."""
FindHolders = Callable[[], Awaitable[Sequence[str]]]


@dataclass(frozen=True)
class FetchProgress:
    """How a piecewise fetch stands: what a progress bar or a log line shows."""

    done: int  # bytes verified (resumed ones included)
    total: int
    rate: float  # bytes/s over the last few seconds
    holders: int  # holders sending right now
    resumed: int = 0  # of `done`, bytes found on disk from an earlier attempt

    @property
    def seconds_left(self) -> float | None:
        return (self.total - self.done) / self.rate if self.rate > 0 else None


class PartialBlob:
    """A blob being filled piece by piece at `store/pieces/<sha256>`; survives restarts."""

    def __init__(self, store: BlobStore, sha256: str, size: int) -> None:
        self.store, self.sha256, self.size = store, sha256, size
        self.path = partial_path(store, sha256)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self.fd).st_size != size:
            os.ftruncate(self.fd, size)  # sparse: nothing is allocated until a piece is written

    def write(self, offset: int, data: bytes) -> None:
        os.pwrite(self.fd, data, offset)

    def present(self, pieces: Sequence[Piece], check: Check) -> list[int]:
        """Indices of the pieces already on disk that pass their check (only written regions are read)."""
        regions = self._data_regions()
        found = []
        for i, piece in enumerate(pieces):
            written = any(lo < piece.offset + piece.length and piece.offset < hi for lo, hi in regions)
            if written and check(piece, os.pread(self.fd, piece.length, piece.offset)):
                found.append(i)
        return found

    def _data_regions(self) -> list[tuple[int, int]]:
        regions, pos = [], 0
        while pos < self.size:
            try:
                start = os.lseek(self.fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after pos
                break
            end = os.lseek(self.fd, start, os.SEEK_HOLE)
            regions.append((start, end))
            pos = end
        return regions

    def commit(self) -> Path:
        """Make the file, every piece of it checked, durable under the blob's name in the store."""
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        return self.store.adopt(self.sha256, self.size, self.path, pieces_checked=True)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def partial_path(store: BlobStore, sha256: str) -> Path:
    return store.root / "pieces" / store.path(sha256).name


def resumable_bytes(store: BlobStore, sha256: str) -> int:
    """Bytes an earlier attempt left of `sha256` (allocated, not yet checked): what a planner may count on."""
    path = partial_path(store, sha256)
    try:
        return min(path.stat().st_blocks * 512, path.stat().st_size)
    except FileNotFoundError:
        return 0


@dataclass
class _Holder:
    name: str
    rate: float | None = None  # bytes/s it has shown
    strikes: int = 0
    banned: bool = False
    busy_until: float = 0.0
    drops: int = 0  # times it was dropped since it last delivered a piece
    retry_at: float = 0.0  # not asked again before this (monotonic), once dropped
    workers: list[asyncio.Task[None]] = field(default_factory=list)

    def strike(self, count: int = 1) -> None:
        """A failed span; at `MAX_STRIKES` in a row, dropped until its backoff ends."""
        was = self.strikes
        self.strikes = min(self.strikes + count, MAX_STRIKES)
        if was < MAX_STRIKES <= self.strikes:
            backoff = min(BACKOFF_SECONDS * 2**self.drops, MAX_BACKOFF_SECONDS)
            self.retry_at, self.drops = time.monotonic() + backoff, self.drops + 1
            log.info("holder %s dropped after %d failures; not asked again for %.0fs", self.name, self.strikes, backoff)

    def span_bytes(self, piece_bytes: int) -> int:
        if self.rate is None:
            return FIRST_SPAN_PIECES * piece_bytes
        return int(min(max(self.rate * SPAN_SECONDS, piece_bytes), MAX_RANGE_BYTES))


class PieceFetch:
    def __init__(
        self,
        store: BlobStore,
        sha256: str,
        size: int,
        pieces: Sequence[Piece],
        check: Check,
        open_fetch: OpenFetch,
        find_holders: FindHolders,
        *,
        limits: TransferLimits = DEFAULT_LIMITS,
        on_progress: Callable[[FetchProgress], None] | None = None,
        exclude: str | None = None,
    ) -> None:
        check_tiling(pieces, size)
        self.store, self.sha256, self.size, self.pieces = store, sha256, size, list(pieces)
        self.sha = sha256[:12] + "..."  # for log lines
        self.check, self.open_fetch, self.find_holders = check, open_fetch, find_holders
        self.limits, self.on_progress, self.exclude = limits, on_progress, exclude
        self.missing: list[int] = []  # piece indices nobody is fetching, ascending
        self.inflight: dict[int, list[str]] = {}  # piece index -> the holders of the streams fetching it
        self.done: set[int] = set()
        self.holders: dict[str, _Holder] = {}
        self.sending: set[str] = set()  # holders with a body arriving right now
        self.recent: deque[tuple[float, int]] = deque()  # (when, bytes) of verified pieces, for the rate
        self.resumed = 0
        self.changed = asyncio.Event()  # pieces were given back or finished: idle streams look again
        self.complete = asyncio.Event()
        self.partial: PartialBlob | None = None

    # -- the whole fetch ---------------------------------------------------------------------------

    async def run(self, deadline: float) -> Path:
        """The blob in the store (hash-checked), by `deadline` (monotonic); a `TransferError` otherwise,
        leaving what arrived on disk for the next attempt."""
        if self.store.has(self.sha256):
            return self.store.path(self.sha256)
        loop = asyncio.get_running_loop()
        self.partial = PartialBlob(self.store, self.sha256, self.size)
        try:
            present = await loop.run_in_executor(None, self.partial.present, self.pieces, self.check)
            self.done = set(present)
            self.resumed = sum(self.pieces[i].length for i in present)
            if present:
                log.info("resuming %s...: %d of %d bytes already here", self.sha256[:12], self.resumed, self.size)
            self.missing = [i for i in range(len(self.pieces)) if i not in self.done]
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._fill()
            path = await loop.run_in_executor(None, self.partial.commit)
        except TimeoutError as exc:
            raise TransferTimeout(f"{self.sha256[:12]}...: {self._summary()} when the deadline passed") from exc
        finally:
            await self._stop_workers()
            self.partial.close()
        return path

    async def _fill(self) -> None:
        ticker = asyncio.ensure_future(self._report())
        try:
            refreshed, alone_since = -float("inf"), time.monotonic()
            while len(self.done) < len(self.pieces):
                if time.monotonic() - refreshed > REFRESH_SECONDS or not self._live():
                    await self._refresh()  # none left: look again every second
                    refreshed = time.monotonic()
                if self._live():
                    alone_since = time.monotonic()
                elif time.monotonic() - alone_since > NO_HOLDERS_SECONDS:
                    raise TransferError(f"no holder of {self.sha} for {NO_HOLDERS_SECONDS:g}s: {self._summary()}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.complete.wait(), 1.0)
        finally:
            ticker.cancel()
        self._emit_progress()

    def _live(self) -> list[_Holder]:
        return [h for h in self.holders.values() if not h.banned and any(not w.done() for w in h.workers)]

    async def _refresh(self) -> None:
        """Add holders not known yet; a banned one stays banned, a struck-out one may come back."""
        try:
            found = await self.find_holders()
        except (TransferError, ProtocolError) as exc:
            log.info("looking up holders of %s... failed: %s", self.sha256[:12], exc)
            return
        for name in dict.fromkeys(found):
            holder = self.holders.setdefault(name, _Holder(name))
            if name == self.exclude or holder.banned or any(not w.done() for w in holder.workers):
                continue
            if time.monotonic() < holder.retry_at:  # dropped, though still listed: not yet
                continue
            holder.strikes = 0
            holder.workers = [asyncio.ensure_future(self._worker(holder)) for _ in range(STREAMS_PER_HOLDER)]

    async def _stop_workers(self) -> None:
        tasks = [w for h in self.holders.values() for w in h.workers if not w.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    # -- one holder's streams ----------------------------------------------------------------------

    async def _worker(self, holder: _Holder) -> None:
        while not holder.banned and holder.strikes < MAX_STRIKES and len(self.done) < len(self.pieces):
            if (wait := holder.busy_until - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            span = self._take(holder)
            if not span:
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 1.0)
                continue
            try:
                await self._fetch_span(holder, span)
            except BlobHashMismatch as exc:
                holder.banned = True
                log.warning("holder %s sent a bad piece of %s...: %s; not asked again", holder.name, self.sha, exc)
            except PeerBusy as exc:
                holder.busy_until = time.monotonic() + 2.0
                log.info("holder %s busy: %s", holder.name, exc)
            except BlobNotFound as exc:
                log.info("holder %s: %s", holder.name, exc)
                holder.strike(MAX_STRIKES)
            except (TransferError, ProtocolError, TimeoutError) as exc:
                log.info("span from %s failed (%s); its pieces go to the others", holder.name, exc or "stalled")
                holder.strike()
            finally:
                self._give_back(span, holder)

    def _take(self, holder: _Holder) -> list[int]:
        """Consecutive missing pieces for `holder` to fetch (or, in the endgame, a slower span's tail)."""
        budget = holder.span_bytes(self.pieces[0].length)
        source = self.missing or self._endgame_tail(holder)
        span: list[int] = []
        for i in source:
            if span and (i != span[-1] + 1 or sum(self.pieces[j].length for j in span) >= budget):
                break
            span.append(i)
        for i in span:
            if i in self.missing:
                self.missing.remove(i)
            self.inflight.setdefault(i, []).append(holder.name)
        return span

    def _endgame_tail(self, holder: _Holder) -> list[int]:
        """The last half of the undone pieces that one stream of a slower holder is fetching alone."""
        mine = holder.rate or 0.0

        def slower(name: str) -> bool:
            other = self.holders[name].rate
            return other is None or other < mine

        alone = sorted(i for i, who in self.inflight.items() if len(who) == 1 and i not in self.done and slower(who[0]))
        return alone[len(alone) // 2 :]

    def _give_back(self, span: list[int], holder: _Holder) -> None:
        for i in span:
            who = self.inflight.get(i, [])
            if holder.name in who:
                who.remove(holder.name)
            if who:
                continue
            self.inflight.pop(i, None)
            if i not in self.done and i not in self.missing:
                self.missing.append(i)
        self.missing.sort()
        self.changed.set()

    async def _fetch_span(self, holder: _Holder, span: list[int]) -> None:
        first, last = self.pieces[span[0]], self.pieces[span[-1]]
        length = last.offset + last.length - first.offset
        loop = asyncio.get_running_loop()
        async with self.open_fetch(holder.name) as stream:
            await open_range(stream, holder.name, self.sha256, first.offset, length, self.limits)
            reader = stream[0]
            self.sending.add(holder.name)
            try:
                for i in span:
                    if all(j in self.done for j in span[span.index(i) :]):
                        return  # the endgame's other copy got here first: hang up
                    piece = self.pieces[i]
                    start = time.monotonic()
                    async with asyncio.timeout(max(STALL_SECONDS, 4 * piece.length / (holder.rate or 1e9))):
                        data = await reader.readexactly(piece.length)
                    if i in self.done:
                        continue
                    if not await loop.run_in_executor(None, self._store_piece, piece, data):
                        raise BlobHashMismatch(f"bytes {piece.offset}+{piece.length} fail their digest")
                    self._finished(holder, i, time.monotonic() - start)
            finally:
                self.sending.discard(holder.name)

    def _store_piece(self, piece: Piece, data: bytes) -> bool:
        if not self.check(piece, data):
            return False
        assert self.partial is not None
        self.partial.write(piece.offset, data)
        return True

    def _finished(self, holder: _Holder, i: int, seconds: float) -> None:
        length = self.pieces[i].length
        rate = length / max(seconds, 1e-6)
        holder.rate = rate if holder.rate is None else 0.7 * holder.rate + 0.3 * rate
        holder.strikes = holder.drops = 0
        self.done.add(i)
        self.recent.append((time.monotonic(), length))
        if len(self.done) == len(self.pieces):
            self.complete.set()

    # -- progress ----------------------------------------------------------------------------------

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_SECONDS)
            self._emit_progress()

    def _emit_progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress())

    def progress(self) -> FetchProgress:
        now = time.monotonic()
        while self.recent and now - self.recent[0][0] > RATE_WINDOW_SECONDS:
            self.recent.popleft()
        window = min(RATE_WINDOW_SECONDS, max(now - self.recent[0][0], PROGRESS_SECONDS)) if self.recent else 1.0
        rate = sum(n for _, n in self.recent) / window
        done = sum(self.pieces[i].length for i in self.done)
        return FetchProgress(done, self.size, rate, len(self.sending), self.resumed)

    def _summary(self) -> str:
        p = self.progress()
        holders = ", ".join(f"{h.name}: {_standing(h)}" for h in self.holders.values())
        return f"{p.done} of {p.total} bytes ({holders or 'no holders found'})"


def _standing(h: _Holder) -> str:
    if h.banned:
        return "banned"
    if (wait := h.retry_at - time.monotonic()) > 0:
        return f"dropped, asked again in {wait:.0f}s"
    return f"{h.strikes} strikes"


def check_tiling(pieces: Sequence[Piece], size: int) -> None:
    """Raise unless `pieces` cover [0, size) exactly, in order, without gaps or overlaps."""
    end = 0
    for piece in pieces:
        if piece.offset != end or piece.length <= 0:
            raise ValueError(f"pieces do not tile the blob: one starts at {piece.offset}, expected {end}")
        end += piece.length
    if end != size:
        raise ValueError(f"pieces cover {end} bytes of a {size}-byte blob")
