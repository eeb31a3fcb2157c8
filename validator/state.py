"""The validator's state on disk: written atomically, committed once per round.

Layout (the folder of round r holds the state the validator runs round r from):

    DIR/COMMITTED                       {"round": r, "folder": "round-<r>", "book_sha256": ...}
    DIR/round-<r>/weights.safetensors   FP32 master weights
    DIR/round-<r>/optimizer.safetensors outer momentum buffers
    DIR/round-<r>/book.json             round, outer steps, ratings, indicator averages,
                                        seen message ids, recent state hashes, rounds gained
    DIR/round-<r>/result.bin            signed result of round r-1 (absent for the first state)
    DIR/round-<r>/patch.bin             its PULSESync patch W_{r-1} -> W_r
    DIR/round-<r>/evidence.bin          its evidence blob (`evidence.py`), served again after a restart
    DIR/ledger.jsonl                    the signed result of every round so far (`ledger.py`)

Commit protocol: every file is written to a temp file, fsynced and renamed (then the folder is
fsynced); `COMMITTED` is replaced last, then the round's signed result is appended to the ledger,
and only then are older folders removed.

The ledger is append-only and outlives the pruned folders. A crash between `COMMITTED` and the
append leaves it one round short: the next commit first appends the missing result from the
previous folder (still there: pruning comes after the append), and `results()` adds it from the
committed folder meanwhile. An uncommitted round never reaches the ledger.

invariant: `COMMITTED` names a folder whose files are all complete. A validator killed at any
point restarts from that folder: a half-written newer folder is ignored and later overwritten,
so a round is either wholly committed (ratings, replay cache and weights together) or not at
all, and re-running it cannot count anything twice.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from protocol.errors import CorruptState
from protocol.messages import MAX_REJECTIONS
from validator import ledger
from validator.atomicfile import write_atomic
from validator.ratings import RatingRecord

COMMITTED = "COMMITTED"
LEDGER = "ledger.jsonl"
STEPS = ("weights", "optimizer", "book", "result", "commit", "ledger", "prune")
"""The persistence steps of a commit, in order; a crash hook is called after each."""

CrashHook = Callable[[str], None]


class Book(BaseModel):
    """Everything but the tensors, as stored in book.json."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    round: int = Field(ge=0)
    """The round this state runs next."""
    outer_steps: int = Field(ge=0)
    ratings: dict[str, RatingRecord]
    indicators: dict[str, float]
    """Moving average of each miner's indicator."""
    seen: list[str]
    """Replay cache, oldest first."""
    gained: dict[str, list[int]] = Field(default_factory=dict)
    """Rounds in which each miner earned standing (`gauntlet.earned`), oldest first, within the last
    `established_window` rounds (at least the newest): who is established (admission, the norm
    gate's reference), and whose rating is kept while it is away."""
    since: dict[str, int] = Field(default_factory=dict)
    """The round each miner in `gained` first earned standing (its seniority: the norm gate's weights)."""
    waited: list[str] = Field(default_factory=list, max_length=MAX_REJECTIONS)
    """Senders whose payload the round before left unexamined, sorted: their newcomer tickets come
    before fresh keys' (`validator.admission`)."""
    states: list[str] = Field(min_length=1)
    """SHA-256 of recent BF16 states, oldest first; the last is the state of `round`."""


@dataclass(frozen=True)
class Snapshot:
    book: Book
    master: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    result: bytes | None  # signed result of the previous round
    patch: bytes | None
    evidence: bytes | None = None  # that result's evidence blob


class _Pointer(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    round: int = Field(ge=0)
    folder: str = Field(pattern=r"^round-[0-9]{12}$")
    book_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class StateStore:
    """Commits and loads the validator's state under one folder."""

    def __init__(self, directory: Path, keep: int = 2, crash_hook: CrashHook | None = None) -> None:
        self.directory = Path(directory)
        self.keep = keep
        self.crash_hook = crash_hook

    def exists(self) -> bool:
        return (self.directory / COMMITTED).exists()

    def commit(self, snap: Snapshot) -> None:
        """Write `snap` as the new committed state (see the module docstring for the order)."""
        folder = self.directory / f"round-{snap.book.round:012d}"
        if folder.exists():  # left by a crash before its commit: never committed, safe to replace
            shutil.rmtree(folder)
        book = _dumps(snap.book.model_dump(mode="json"))
        write_atomic(folder / "weights.safetensors", save_tensors(snap.master))
        self._step("weights")
        write_atomic(folder / "optimizer.safetensors", save_tensors(snap.momentum))
        self._step("optimizer")
        write_atomic(folder / "book.json", book)
        self._step("book")
        if snap.result is not None and snap.patch is not None:
            write_atomic(folder / "patch.bin", snap.patch)
            if snap.evidence is not None:
                write_atomic(folder / "evidence.bin", snap.evidence)
            write_atomic(folder / "result.bin", snap.result)
        self._step("result")
        pointer = _Pointer(round=snap.book.round, folder=folder.name, book_sha256=hashlib.sha256(book).hexdigest())
        write_atomic(self.directory / COMMITTED, _dumps(pointer.model_dump(mode="json")))
        self._step("commit")
        if snap.result is not None:
            self._append_ledger(snap.book.round)
        self._step("ledger")
        self._prune(snap.book.round)
        self._step("prune")

    def load(self) -> Snapshot:
        """The committed state; `CorruptState` if it is missing, unreadable or inconsistent."""
        try:
            pointer = _Pointer.model_validate_json((self.directory / COMMITTED).read_bytes())
            folder = self.directory / pointer.folder
            book_bytes = (folder / "book.json").read_bytes()
            if hashlib.sha256(book_bytes).hexdigest() != pointer.book_sha256:
                raise CorruptState(f"{folder / 'book.json'} differs from the committed one")
            book = Book.model_validate_json(book_bytes)
            master = load_tensors((folder / "weights.safetensors").read_bytes())
            momentum = load_tensors((folder / "optimizer.safetensors").read_bytes())
            result, patch = _optional(folder / "result.bin"), _optional(folder / "patch.bin")
            evidence = _optional(folder / "evidence.bin")
        except (OSError, ValidationError, SafetensorError) as exc:
            raise CorruptState(f"cannot load the validator state in {self.directory}: {exc}") from exc
        if book.round != pointer.round:
            raise CorruptState(f"book is for round {book.round}, COMMITTED says {pointer.round}")
        return Snapshot(book, master, momentum, result, patch, evidence)

    def previous_weights(self, round_: int) -> dict[str, torch.Tensor] | None:
        """W_{round-1} in BF16, from the folder of the previous round while it is on disk (`keep` >= 2)."""
        path = self.directory / f"round-{round_ - 1:012d}" / "weights.safetensors"
        try:
            master = load_tensors(path.read_bytes()) if round_ > 0 else None
        except (OSError, SafetensorError):
            return None
        return {name: t.to(torch.bfloat16) for name, t in master.items()} if master is not None else None

    def rewind(self) -> bool:
        """Go back one committed round (to the previous folder, on disk while `keep` >= 2) because the
        last round's result did not count: another validator's result for that round did. Returns
        False when there is no earlier folder to go back to.

        Order: the ledger drops the superseded entry first, then `COMMITTED` names the earlier folder,
        then the newer folder goes. A crash in between leaves a state that is rewound again on resume
        (its last result still does not count), never a ledger entry that did not count.
        """
        pointer = self._pointer()
        earlier = self.directory / f"round-{pointer.round - 1:012d}"
        if pointer.round == 0 or not (earlier / "book.json").exists():
            return False
        book = (earlier / "book.json").read_bytes()
        ledger.truncate(self.directory / LEDGER, pointer.round - 1)
        back = _Pointer(round=pointer.round - 1, folder=earlier.name, book_sha256=hashlib.sha256(book).hexdigest())
        write_atomic(self.directory / COMMITTED, _dumps(back.model_dump(mode="json")))
        shutil.rmtree(self.directory / pointer.folder)
        return True

    def _pointer(self) -> _Pointer:
        try:
            return _Pointer.model_validate_json((self.directory / COMMITTED).read_bytes())
        except (OSError, ValidationError) as exc:
            raise CorruptState(f"cannot load the validator state in {self.directory}: {exc}") from exc

    def results(self) -> list[bytes]:
        """The signed result of every round the ledger holds, in round order, the committed one included.

        A state written before the ledger existed starts at the oldest folder still on disk.
        """
        entries = ledger.read(self.directory / LEDGER)
        try:
            pointer = _Pointer.model_validate_json((self.directory / COMMITTED).read_bytes())
            result = _optional(self.directory / pointer.folder / "result.bin")
        except (OSError, ValidationError) as exc:
            raise CorruptState(f"cannot load the validator state in {self.directory}: {exc}") from exc
        last = pointer.round - 1
        if result is not None and (not entries or entries[-1][0] == last - 1):
            entries.append((last, result))
        return [envelope for _, envelope in entries]

    def _append_ledger(self, current: int) -> None:
        """Append the results of rounds the ledger lacks, up to round `current - 1`, from the round folders."""
        path = self.directory / LEDGER
        entries = ledger.read(path)
        start = entries[-1][0] + 1 if entries else 0
        for r in range(start, current):
            result = _optional(self.directory / f"round-{r + 1:012d}" / "result.bin")
            if result is not None:  # absent only in a state older than the ledger
                ledger.append(path, r, result)

    def _prune(self, current: int) -> None:
        """Remove committed folders beyond `keep` and any newer (uncommitted) one."""
        folders = sorted(p for p in self.directory.glob("round-*") if p.is_dir())
        for p in folders:
            r = int(p.name.removeprefix("round-"))
            if r > current or r <= current - self.keep:
                shutil.rmtree(p)

    def _step(self, name: str) -> None:
        if self.crash_hook is not None:
            self.crash_hook(name)


def _optional(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def _dumps(obj: Mapping[str, object]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
