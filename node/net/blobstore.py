"""Content-addressed blob store on disk: every blob is named by its SHA-256 and written atomically.

Layout under `root`:

    blobs/<sha256>      complete, verified blobs (read-only once written)
    partial/<random>    blobs being received; removed on any failure (and by `clear_partials`)
    pieces/<sha256>     a large blob filled piece by piece (`pieces.py`): kept across restarts,
                        each piece checked again before it counts, the whole file before `adopt`

Invariant: a file in `blobs/` has exactly the SHA-256 of its name. A `BlobWriter` only renames
its temp file into place after checking size and hash and fsyncing, so a crash or a lying peer
leaves at most a stale file in `partial/`, never a wrong blob.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from protocol.errors import (
    BlobHashMismatch,
    BlobNotFound,
    MalformedPayload,
    SizeLimitExceeded,
    TruncatedPayload,
)
from validator.atomicfile import fsync_dir

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_PARALLEL_BYTES = 1 << 20  # below this, hashing inline is cheaper than a thread hand-off
_HASHER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="blob-sha256")


def check_sha256(sha256: str) -> str:
    """`sha256` if it is 64 lowercase hex characters (so it is also a safe file name)."""
    if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
        raise MalformedPayload(f"not a SHA-256 hex digest: {sha256!r:.80}")
    return sha256


class BlobStore:
    """Blobs on disk by SHA-256. Safe for concurrent writers (each has its own temp file)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._blobs = self.root / "blobs"
        self._partial = self.root / "partial"
        self._blobs.mkdir(parents=True, exist_ok=True)
        self._partial.mkdir(parents=True, exist_ok=True)
        self._receiving: set[BlobWriter] = set()  # open writers, for `received`

    def path(self, sha256: str) -> Path:
        return self._blobs / check_sha256(sha256)

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def size(self, sha256: str) -> int:
        try:
            return self.path(sha256).stat().st_size
        except FileNotFoundError as exc:
            raise BlobNotFound(f"no blob {sha256[:12]}... in {self.root}") from exc

    def open(self, sha256: str) -> BinaryIO:
        try:
            return self.path(sha256).open("rb")
        except FileNotFoundError as exc:
            raise BlobNotFound(f"no blob {sha256[:12]}... in {self.root}") from exc

    def read(self, sha256: str) -> bytes:
        with self.open(sha256) as f:
            return f.read()

    def put(self, data: bytes) -> str:
        """Store `data` and return its SHA-256."""
        sha256 = hashlib.sha256(data).hexdigest()
        with self.writer(sha256, len(data)) as writer:
            writer.write(data)
            writer.commit()
        return sha256

    def writer(self, sha256: str, size: int) -> BlobWriter:
        """A writer for a blob announced as (`sha256`, `size`); see `BlobWriter`."""
        return BlobWriter(self, check_sha256(sha256), size)

    def received(self, sha256: str) -> int:
        """Bytes of `sha256` received so far by a writer still open (0 if none): for progress bars."""
        return max((w.written for w in list(self._receiving) if w.sha256 == sha256), default=0)

    def remove(self, sha256: str) -> None:
        self.path(sha256).unlink(missing_ok=True)

    def adopt(self, sha256: str, size: int, path: Path, *, pieces_checked: bool = False) -> Path:
        """Make the complete file `path` (on this store's file system, fsynced) blob `sha256`, once
        its size and hash are checked; a file that fails either is removed. Blocks: run it in a thread.

        `pieces_checked`: every byte of the file already passed a digest from a list that names
        `sha256`'s content (a checkpoint's piece index, whose own SHA-256 the validator signed):
        the whole-file hash would check those bytes a second time, so it is skipped."""
        check_sha256(sha256)
        if (actual := path.stat().st_size) != size:
            path.unlink()
            raise TruncatedPayload(f"{path.name} has {actual} of {size} bytes")
        if not pieces_checked:
            self._check_hash(sha256, path)
        final = self.path(sha256)
        os.replace(path, final)
        fsync_dir(final.parent)
        return final

    @staticmethod
    def _check_hash(sha256: str, path: Path) -> None:
        hasher = hashlib.sha256()
        with path.open("rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                hasher.update(chunk)
        if hasher.hexdigest() != sha256:
            path.unlink()
            raise BlobHashMismatch(f"{path.name} hashes to {hasher.hexdigest()[:12]}..., not {sha256[:12]}...")

    def __iter__(self) -> Iterator[str]:
        return (p.name for p in self._blobs.iterdir() if _SHA256_RE.fullmatch(p.name))

    def partial_files(self) -> list[Path]:
        """Temp files of receptions in progress (empty when nothing is being received)."""
        return list(self._partial.iterdir())

    def clear_partials(self) -> None:
        """Remove temp files a crash left behind; call at start-up, when this process owns the store."""
        for stale in self.partial_files():  # never trusted, never resumed
            stale.unlink(missing_ok=True)

    def _temp_file(self, sha256: str) -> tuple[int, Path]:
        fd, name = tempfile.mkstemp(dir=self._partial, prefix=f"{sha256[:16]}.")
        return fd, Path(name)


class BlobWriter:
    """Receives one blob into a temp file, hashing as it goes; `commit` checks, fsyncs and renames.

    Never holds more than the announced size: a write past it raises `SizeLimitExceeded`. Use as
    a context manager: leaving the block without `commit` (an error, a timeout, a cancel) removes
    the temp file. `write` blocks on disk and hashing, so async callers run it in an executor.
    """

    def __init__(self, store: BlobStore, sha256: str, size: int) -> None:
        if size < 0:
            raise SizeLimitExceeded(f"negative blob size {size}")
        self.sha256 = sha256
        self.size = size
        self.written = 0
        self._store = store
        self._hash = hashlib.sha256()
        fd, self._tmp = store._temp_file(sha256)
        try:
            self._file: BinaryIO | None = os.fdopen(fd, "wb", buffering=0)
        except BaseException:  # no writer exists to abort: remove the temp file here
            os.close(fd)
            self._tmp.unlink(missing_ok=True)
            raise
        self.committed = False
        store._receiving.add(self)

    def write(self, chunk: bytes | memoryview) -> None:
        self.write_many((chunk,))

    def write_many(self, chunks: Iterable[bytes | memoryview]) -> None:
        """Append `chunks`; a batch that would run past the announced size is refused whole."""
        assert self._file is not None, "writer is closed"
        chunks = list(chunks)
        total = sum(len(chunk) for chunk in chunks)
        if self.written + total > self.size:
            raise SizeLimitExceeded(f"blob {self.sha256[:12]}... is longer than its announced {self.size} bytes")
        # Hash on another thread while this one writes: both release the GIL on large buffers.
        hashed = _HASHER.submit(_update, self._hash, chunks) if total >= _PARALLEL_BYTES else None
        for chunk in chunks:
            if hashed is None:
                self._hash.update(chunk)
            self._file.write(chunk)
        if hashed is not None:
            hashed.result()
        self.written += total

    def commit(self) -> Path:
        """Check size and hash, make the blob durable and visible under its name."""
        assert self._file is not None, "writer is closed"
        if self.written != self.size:
            raise TruncatedPayload(f"blob {self.sha256[:12]}... has {self.written} of {self.size} bytes")
        actual = self._hash.hexdigest()
        if actual != self.sha256:
            raise BlobHashMismatch(f"blob announced as {self.sha256[:12]}... hashes to {actual[:12]}...")
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        self._store._receiving.discard(self)
        final = self._store.path(self.sha256)
        os.replace(self._tmp, final)  # same content if it already existed: content-addressed
        fsync_dir(final.parent)
        self.committed = True
        return final

    def abort(self) -> None:
        self._store._receiving.discard(self)
        if self._file is not None:
            self._file.close()
            self._file = None
        if not self.committed:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()


def _update(hasher: Any, chunks: list[bytes | memoryview]) -> None:
    for chunk in chunks:
        hasher.update(chunk)
