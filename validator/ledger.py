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
    truncate(path, round_)                 # drop round_ and later: a result that did not count (rare)
    entries = read(path)                   # [(round, envelope bytes)], in file order
    write(path, entries)                   # a whole ledger at once (an export)
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
from protocol.signing import MAX_ENVELOPE_BYTES, open_signed
from validator.atomicfile import fsync_dir, write_atomic

Entry = tuple[int, bytes]  # (round, signed RoundResult envelope)
MAX_LINE_BYTES = 2 * MAX_ENVELOPE_BYTES + 64  # one entry: the envelope in hex, and its round


def read(path: Path) -> list[Entry]:
    """The complete lines of the ledger at `path` (none if it does not exist); `CorruptState` on a bad line.

    Lines are parsed, not checked: `verify_chain` checks what the envelopes say.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CorruptState(f"cannot read the ledger {path}: {exc}") from exc
    complete = data[: data.rfind(b"\n") + 1]  # a line cut short by a crash mid-append is not part of it
    return [_parse(line, path) for line in complete.splitlines()]


def write(path: Path, entries: Sequence[Entry]) -> None:
    """A whole ledger at once (atomically), e.g. beside an exported model."""
    write_atomic(path, b"".join(_line(round_, envelope) for round_, envelope in entries))


def truncate(path: Path, round_: int) -> None:
    """Drop the entries of round `round_` and later (a validator's result that another validator's
    result superseded: it never counted). The one exception to append-only, written atomically."""
    entries = read(path)
    if entries and entries[-1][0] >= round_:
        write(path, [e for e in entries if e[0] < round_])


def append(path: Path, round_: int, envelope: bytes) -> None:
    """Add round `round_`'s signed result after the last complete line (a no-op if it is there already).

    Reads only the file's tail, so a commit costs the same in round 10 and in round 100,000.
    """
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        complete, last = _tail(fd, path)
        if last is not None and last >= round_:
            return
        if last is not None and last != round_ - 1:
            raise CorruptState(f"{path} ends at round {last}; round {round_} would leave a gap")
        os.ftruncate(fd, complete)  # drops a torn tail; a no-op otherwise
        os.lseek(fd, complete, os.SEEK_SET)
        view = memoryview(_line(round_, envelope))
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


def _tail(fd: int, path: Path) -> tuple[int, int | None]:
    """(length of the complete lines, round of the last one or None) from the end of the file."""
    end = os.lseek(fd, 0, os.SEEK_END)
    start = max(0, end - 2 * MAX_LINE_BYTES)
    os.lseek(fd, start, os.SEEK_SET)
    chunk = os.read(fd, end - start)
    cut = chunk.rfind(b"\n") + 1  # after the last newline: what follows is a torn append
    if cut == 0:
        if start > 0:
            raise CorruptState(f"{path}: no line ends in its last {len(chunk)} bytes")
        return 0, None
    begin = chunk.rfind(b"\n", 0, cut - 1) + 1
    if begin == 0 and start > 0:
        raise CorruptState(f"{path}: its last line is longer than any ledger entry")
    return start + cut, _parse(chunk[begin : cut - 1], path)[0]


def _line(round_: int, envelope: bytes) -> bytes:
    return json.dumps({"envelope": envelope.hex(), "round": round_}, sort_keys=True).encode() + b"\n"


def _parse(line: bytes, path: Path) -> Entry:
    try:
        record = json.loads(line)
        round_, envelope = record["round"], bytes.fromhex(record["envelope"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptState(f"{path}: not a ledger entry: {exc}") from exc
    if not isinstance(round_, int):
        raise CorruptState(f"{path}: round {round_!r} is not an integer")
    return round_, envelope


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
