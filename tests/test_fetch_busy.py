"""A fetch whose only real holder answers BUSY asks it again (with growing pauses, a bounded number of
times, within the blob's deadline) instead of failing; a holder busy for good still fails it."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from node.net import fetching
from node.net.fetching import HolderBook, Progress, fetch_first
from node.net.memory import MemoryNetwork
from node.net.peer import RunRecords
from node.net.streams import TransferLimits, read_reply, send_request
from node.net.transfer import FETCH, fetch_request
from protocol.errors import PeerBusy, TransferError
from protocol.identity import Identity


def busy_then(answers: int, path: Path) -> tuple[list[float], fetching.Attempt]:
    """An attempt that answers BUSY `answers` times, then delivers `path`; the times it was asked."""
    asked: list[float] = []

    async def attempt(holder: str, on_body: Callable[[Progress], None]) -> Path:
        asked.append(time.monotonic())
        if len(asked) <= answers:
            raise PeerBusy(f"{holder} is busy")
        return path

    return asked, attempt


def test_a_busy_only_holder_is_asked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetching, "BUSY_PAUSE_SECONDS", (0.05, 0.2))
    asked, attempt = busy_then(3, tmp_path)
    book = HolderBook()
    got = asyncio.run(
        fetch_first(["validator"], attempt, book=book, sha256="ab" * 32, deadline=time.monotonic() + 10,
                    hedge_after=1.0, hedge_rate=1e6)
    )  # fmt: skip
    assert got == tmp_path and len(asked) == 4
    assert all(b - a >= 0.03 for a, b in itertools.pairwise(asked))  # paused between, not hammered
    assert book.order(["validator", "other"])[0] == "validator"  # busy is not a failure


def test_a_holder_busy_for_good_fails_the_fetch_after_bounded_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetching, "BUSY_PAUSE_SECONDS", (0.01, 0.02))
    asked, attempt = busy_then(10**6, tmp_path)
    with pytest.raises(TransferError, match="busy"):
        asyncio.run(
            fetch_first(["validator"], attempt, book=HolderBook(), sha256="ab" * 32, deadline=time.monotonic() + 10,
                        hedge_after=1.0, hedge_rate=1e6)
        )  # fmt: skip
    assert len(asked) == fetching.BUSY_RETRIES + 1


def test_a_fetch_waits_for_the_only_holders_send_slot(tmp_path: Path) -> None:
    """The validator's one send slot is held by another reader for ~1 s: a miner's fetch of the
    patch (the validator its only holder) succeeds once the slot is free (before: failed BUSY)."""
    run = hashlib.sha256(b"fetch-busy-run").hexdigest()
    validator_key = Identity.generate()
    limits = TransferLimits(max_fetch_streams=1, reserved_fetch_streams=0, open_timeout=5.0)
    net = MemoryNetwork(RunRecords(run, (validator_key.public_hex,), 3600.0, 5), limits)
    patch = bytes(range(256)) * 1024  # 256 KiB

    async def main() -> bytes:
        validator = net.join(validator_key, tmp_path / "validator", role="validator")
        sha = validator.store.put(patch)
        validator.hold(sha, 0)
        await validator.heartbeat(0, None)
        net.uplink[validator.peer_id] = 256 * 1024  # the other reader's copy takes ~1 s
        miner = net.join(Identity.generate(), tmp_path / "miner", role="miner")
        async with net.open("Reader", validator.peer_id, FETCH) as (reader, writer):
            await send_request(writer, fetch_request(sha, len(patch)), limits)
            assert (await read_reply(reader, 5.0))[0].name == "OK"
            path = await asyncio.wait_for(miner.fetch(sha, len(patch), 0), 20)
        return path.read_bytes()

    assert asyncio.run(main()) == patch
