"""The content-addressed blob store: atomic, verified, nothing partial ever visible."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from node.net.blobstore import BlobStore
from protocol.errors import (
    BlobHashMismatch,
    BlobNotFound,
    MalformedPayload,
    SizeLimitExceeded,
    TruncatedPayload,
)


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "store")


def test_put_read_roundtrip(store: BlobStore) -> None:
    data = os.urandom(100_000)
    sha = store.put(data)
    assert sha == hashlib.sha256(data).hexdigest()
    assert store.has(sha) and store.size(sha) == len(data) and store.read(sha) == data
    assert list(store) == [sha]
    assert store.put(data) == sha  # idempotent


def test_empty_blob(store: BlobStore) -> None:
    sha = store.put(b"")
    assert store.read(sha) == b""


def test_incremental_writer_commits_only_when_verified(store: BlobStore) -> None:
    data = os.urandom(3 * 2**20)
    sha = hashlib.sha256(data).hexdigest()
    with store.writer(sha, len(data)) as writer:
        view = memoryview(data)
        writer.write_many([view[i : i + 2**20] for i in range(0, len(data), 2**20)])
        assert not store.has(sha)  # invisible until commit
        assert len(store.partial_files()) == 1
        writer.commit()
    assert store.read(sha) == data and store.partial_files() == []


def test_bytes_received_so_far_are_visible_until_the_writer_closes(store: BlobStore) -> None:
    data = os.urandom(3000)
    sha = hashlib.sha256(data).hexdigest()
    assert store.received(sha) == 0
    with store.writer(sha, len(data)) as blob:
        blob.write(data[:1000])
        assert store.received(sha) == 1000 and store.received("0" * 64) == 0
        blob.write(data[1000:])
        blob.commit()
        assert store.received(sha) == 0
    with store.writer(sha, len(data)) as blob:
        blob.write(data[:10])
    assert store.received(sha) == 0  # aborted


def test_wrong_hash_is_discarded(store: BlobStore) -> None:
    data = b"x" * 1000
    claimed = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(BlobHashMismatch), store.writer(claimed, len(data)) as writer:
        writer.write(data)
        writer.commit()
    assert not store.has(claimed) and store.partial_files() == []


def test_short_blob_is_discarded(store: BlobStore) -> None:
    data = b"abc"
    sha = hashlib.sha256(data).hexdigest()
    with pytest.raises(TruncatedPayload), store.writer(sha, 10) as writer:
        writer.write(data)
        writer.commit()
    assert not store.has(sha) and store.partial_files() == []


def test_writer_never_holds_more_than_announced(store: BlobStore) -> None:
    sha = hashlib.sha256(b"0123456789").hexdigest()
    with pytest.raises(SizeLimitExceeded), store.writer(sha, 5) as writer:
        writer.write(b"0123")
        writer.write(b"456789")
    assert store.partial_files() == []


def test_exception_inside_block_aborts(store: BlobStore) -> None:
    sha = hashlib.sha256(b"data").hexdigest()
    with pytest.raises(RuntimeError), store.writer(sha, 4) as writer:
        writer.write(b"da")
        raise RuntimeError("connection lost")
    assert store.partial_files() == [] and not store.has(sha)


@pytest.mark.parametrize("name", ["../../etc/passwd", "ABC", "0" * 63, "g" * 64, ""])
def test_names_must_be_sha256_hex(store: BlobStore, name: str) -> None:
    with pytest.raises(MalformedPayload):
        store.path(name)


def test_missing_blob(store: BlobStore) -> None:
    with pytest.raises(BlobNotFound):
        store.open("0" * 64)


def test_clear_partials_after_a_crash(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    writer = store.writer("0" * 64, 10)
    writer.write(b"12345")  # the process "dies" here: no commit, no abort
    reopened = BlobStore(tmp_path)
    assert len(reopened.partial_files()) == 1
    reopened.clear_partials()
    assert reopened.partial_files() == [] and list(reopened) == []
