"""The run's signed round results, kept whole: an append-only file, and the chain check anyone can run.

The validator's state folder keeps only its last `keep_rounds` round folders, but the signed
result of every round is small (a few KiB) and is what proves who trained the model, so each
one is also appended here once its round is committed (`state.py`). `pulse export` ships the
same file beside the model.

File: one JSON line per round, in round order, `{"envelope": "<hex of the signed RoundResult>",
"round": r}`. An append is one `write` plus `fsync`; a line cut short by a crash has no newline
and is dropped (by readers, and before the next append), so the file is always a prefix of the
chain.

    append(path, round_, envelope)         # idempotent: a round already in the file is skipped
    entries = read(path)                   # [(round, envelope bytes)], round order
    results = verify_chain(envelopes, run_id, validators)   # raises BrokenChain, InvalidSignature...

`verify_chain` checks every signature (a key of the run's validators, this run, kind
`round_result`), that rounds follow each other with no gap, and that each result's base state is
the state the previous result produced: the results form one hash chain, from the first entry's
base state to the last entry's new state.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from pathlib import Path

from protocol.errors import BrokenChain, CorruptState
from protocol.messages import RoundResult
from protocol.signing import open_signed
from validator.atomicfile import fsync_dir

Entry = tuple[int, bytes]  # (round, signed RoundResult envelope)


def read(path: Path) -> list[Entry]:
    """The complete lines of the ledger at `path` (none if it does not exist); `CorruptState` on a bad line.

    Lines are parsed, not checked: `verify_chain` checks what the envelopes say.
    """
    return _parse(_complete(path), path)


def append(path: Path, round_: int, envelope: bytes) -> None:
    """Add round `round_`'s signed result after the last complete line (a no-op if it is there already)."""
    complete = _complete(path)
    entries = _parse(complete, path)
    if entries and entries[-1][0] >= round_:
        return
    if entries and entries[-1][0] != round_ - 1:
        raise CorruptState(f"{path} ends at round {entries[-1][0]}; round {round_} would leave a gap")
    created = not path.exists()
    line = json.dumps({"envelope": envelope.hex(), "round": round_}, sort_keys=True).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, len(complete))  # drops a torn tail; a no-op otherwise
        os.lseek(fd, len(complete), os.SEEK_SET)
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


def _complete(path: Path) -> bytes:
    """The file up to its last newline: a line cut short by a crash mid-append is not part of it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return b""
    except OSError as exc:
        raise CorruptState(f"cannot read the ledger {path}: {exc}") from exc
    return data[: data.rfind(b"\n") + 1]


def _parse(complete: bytes, path: Path) -> list[Entry]:
    entries: list[Entry] = []
    for number, line in enumerate(complete.splitlines(), start=1):
        try:
            record = json.loads(line)
            round_, envelope = record["round"], bytes.fromhex(record["envelope"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptState(f"{path}: line {number} is not a ledger entry: {exc}") from exc
        if not isinstance(round_, int):
            raise CorruptState(f"{path}: line {number}: round {round_!r} is not an integer")
        entries.append((round_, envelope))
    return entries


def verify_chain(envelopes: Sequence[bytes], run_id: str, validators: Collection[str]) -> list[RoundResult]:
    """The round results, each checked (see the module docstring); the first failure raises.

    `InvalidSignature` / `MalformedPayload` / `WrongRun` for an envelope that does not open,
    `BrokenChain` for a signer outside `validators`, a gap between rounds or a broken link.
    """
    results: list[RoundResult] = []
    for envelope in envelopes:
        verified = open_signed(envelope, run_id=run_id, expect=RoundResult)
        result = verified.message
        if verified.sender_hex not in validators:
            who = verified.sender_hex[:12]
            raise BrokenChain(f"round {result.round}: signed by {who}..., not a validator of the run")
        if results:
            before = results[-1]
            if result.round != before.round + 1:
                raise BrokenChain(f"round {before.round} is followed by round {result.round}")
            if result.base_state_hash != before.new_state_hash:
                raise BrokenChain(
                    f"round {result.round} starts from {result.base_state_hash[:12]}..., "
                    f"round {before.round} ended at {before.new_state_hash[:12]}..."
                )
        results.append(result)
    return results
