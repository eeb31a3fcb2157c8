"""Decoded updates kept for the rest of a round in files on the validator's disk, mapped back on demand.

A round reads each admissible update three times (inspect, evaluate, aggregate). Decoding is the
expensive part (seconds per update at 0.5B parameters), so each distinct payload is decoded once
and its tensors are written, in the exact dtype the decoder yields, to one file per payload:

    spill = DecodedSpill(folder, budget_bytes)     # the folder is the spill's own: close removes it
    spill.put(key, update)          # after the one decode; False when the budget is spent
    update = spill.get(key)         # memory-mapped tensors, or None: decode again
    spill.close()                   # deletes every file: the round is over

Memory stays flat in the number of submissions: an update read back is a copy-on-write mapping of
its file, so only the one being used is resident (and its pages are reclaimable cache). Disk is
bounded by `budget_bytes` (what does not fit is decoded again when needed, as before).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from protocol.state import State, StateDict

_ALIGN = 64


def _padded(nbytes: int) -> int:
    return nbytes + (-nbytes % _ALIGN)


@dataclass(frozen=True)
class _Entry:
    path: Path
    layout: tuple[tuple[str, tuple[int, ...], torch.dtype, int], ...]  # name, shape, dtype, byte offset
    size: int


class DecodedSpill:
    """One round's decoded updates on disk, at most `budget_bytes` of them; `close` removes them."""

    def __init__(self, directory: Path | None, budget_bytes: int) -> None:
        self.budget, self.used = budget_bytes, 0
        self.entries: dict[str, _Entry] = {}
        self.folder: Path | None = None
        if directory is not None and budget_bytes > 0:
            self.folder = Path(directory)
            self.folder.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, update: State) -> bool:
        """Write `update` under `key` (once); False when there is no room left in the budget."""
        if key in self.entries:
            return True
        size = sum(_padded(t.numel() * t.element_size()) for t in update.values())
        if self.folder is None or self.used + size > self.budget:
            return False
        path = self.folder / f"{len(self.entries):06d}.bin"
        layout, offset = [], 0
        with path.open("wb") as f:
            for name in sorted(update):
                t = update[name].detach().cpu().contiguous()
                f.write(t.reshape(-1).view(torch.uint8).numpy().data)
                layout.append((name, tuple(t.shape), t.dtype, offset))
                offset += t.numel() * t.element_size()
                pad = -offset % _ALIGN  # every tensor starts aligned for its dtype's view
                f.write(bytes(pad))
                offset += pad
        self.used += size
        self.entries[key] = _Entry(path, tuple(layout), size)
        return True

    def get(self, key: str) -> StateDict | None:
        """The update written under `key`, mapped from its file (copy-on-write), or None."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        if entry.size == 0:
            return {name: torch.empty(shape, dtype=dtype) for name, shape, dtype, _ in entry.layout}
        raw = torch.from_numpy(np.memmap(entry.path, dtype=np.uint8, mode="c", shape=(entry.size,)))
        out: StateDict = {}
        for name, shape, dtype, offset in entry.layout:
            nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
            out[name] = raw[offset : offset + nbytes].view(dtype).reshape(shape)
        return out

    def close(self) -> None:
        """Delete every file of the round (mapped tensors still alive keep their pages until freed)."""
        if self.folder is not None and self.folder.exists():
            shutil.rmtree(self.folder)
        self.entries.clear()
        self.used = 0

    def __enter__(self) -> DecodedSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
