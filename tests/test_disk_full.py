"""A full disk (ENOSPC, simulated at the file write) while writing a blob, a file or a validator
round: a clear error, no temp file left, the previous state intact and usable."""

from __future__ import annotations

import errno
import hashlib
import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from node.net.blobstore import BlobStore
from protocol.identity import Identity
from validator import atomicfile
from validator.config import GauntletConfig
from validator.core import Validator
from validator.state import StateStore

RUN = hashlib.sha256(b"pulse-test-disk-full").hexdigest()


class FullFile(io.RawIOBase):
    """A file on a full disk: every write fails with ENOSPC."""

    def __init__(self, fd: int) -> None:
        os.close(fd)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def _full_fdopen(fd: int, *args: Any, **kwargs: Any) -> FullFile:
    return FullFile(fd)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_atomic_write_on_a_full_disk_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.json"
    atomicfile.write_atomic(target, b"old")
    monkeypatch.setattr(atomicfile.os, "fdopen", _full_fdopen)
    with pytest.raises(OSError, match="No space left"):
        atomicfile.write_atomic(target, b"new contents")
    assert target.read_bytes() == b"old"
    assert _files(tmp_path) == {"state.json"}  # no temp file left behind


def test_blob_put_on_a_full_disk_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = BlobStore(tmp_path)
    kept = store.put(b"already here")
    monkeypatch.setattr("node.net.blobstore.os.fdopen", _full_fdopen)
    with pytest.raises(OSError, match="No space left"):
        store.put(b"a new blob" * 1000)
    assert list(store) == [kept] and not store.partial_files()
    assert store.read(kept) == b"already here"


class ZeroEvaluator:
    def loss(self, weights: dict[str, torch.Tensor], batch: object) -> float:
        return 1.0


def test_a_validator_round_on_a_full_disk_leaves_the_last_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = GauntletConfig(codec="dense")
    master = {"w": torch.randn(8, 8)}
    folder = tmp_path / "validator"
    me = Identity.generate()
    v = Validator.create(folder, cfg, RUN, me, master, ZeroEvaluator(), lambda seed: seed)  # type: ignore[arg-type]
    v.run_round([])  # round 0 committed: the state of round 1
    before = StateStore(folder).load().book
    monkeypatch.setattr(atomicfile.os, "fdopen", _full_fdopen)
    with pytest.raises(OSError, match="No space left"):
        v.run_round([])
    monkeypatch.undo()
    assert not [p for p in folder.rglob("*.tmp")]  # no temp file left behind
    after = StateStore(folder).load()
    assert after.book == before and after.book.round == 1  # the last commit, untouched
    reopened = Validator.open(folder, cfg, RUN, me, ZeroEvaluator(), lambda seed: seed)  # type: ignore[arg-type]
    assert reopened.round == 1 and reopened.state_hash == v.state_hash
    reopened.run_round([])  # space is back: the round commits
    assert StateStore(folder).load().book.round == 2


def test_a_blob_writer_that_cannot_open_its_temp_file_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BlobStore(tmp_path)

    def refuse(fd: int, *args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("node.net.blobstore.os.fdopen", refuse)
    with pytest.raises(OSError, match="No space left"):
        store.put(b"a blob")
    assert not store.partial_files() and not list(store)
