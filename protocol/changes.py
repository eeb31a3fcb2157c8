"""PULSESync's per-weight encoder pass as torch tensor ops, where the states already are.

For a tensor that does not live in host memory (a GPU), everything that touches every weight
runs on its device: the XOR/compare of old and new bit patterns, the old weights' exponent
classes, each class's size, and the rank of every changed position within its class. Only the
changes cross to the host, as what the compiled coder (syncpass.py) consumes:

    cls (k,) uint8   old exponent of each change, natural order
    gap (k,) int     ranks skipped since the class's previous change (the first counts from -1)
    zs  (k,)         zigzag(new - old) - 1 on the bit patterns, in the weights' width
    n   (256,) int64 class sizes

so the host's work and the bytes it receives grow with what changed, not with the model. The
same code runs on CPU tensors (tests run it there and compare with the compiled host walk, bit
for bit); on the CPU the compiled walk is faster, one fused pass instead of a sort, so
pulsesync.py uses this pass only for tensors off the host.

Ranks: within a slab, a stable sort of the exponent classes puts every class's members in
position order, so a member's rank is its sorted index minus the class's start; ranks carry
across slabs by per-class counts. A slab bounds the sort's memory (its int64 permutation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from protocol.contexts import NUM_CONTEXTS

_INT = {16: torch.int16, 32: torch.int32}
_HOST = {16: np.uint16, 32: np.uint32}
SLAB = 1 << 23  # elements sorted at a time: 8M int64 indices, 64 MB of device memory


@dataclass
class DeviceChanges:
    """One tensor's changes as the host coder receives them (see the module docstring)."""

    cls: np.ndarray
    gap: np.ndarray
    zs: np.ndarray
    n: np.ndarray


def collect(old: torch.Tensor, new: torch.Tensor, shift: int, emask: int, width: int) -> DeviceChanges:
    """The changes from `old` to `new` (same dtype and shape, on any one device)."""
    a = old.detach().reshape(-1).view(_INT[width])
    b = new.detach().reshape(-1).view(_INT[width])
    pos, cls_k, rank, counts = rank_marked(a, a != b, shift, emask)
    n = counts.cpu().numpy()
    if not len(pos):
        empty = np.zeros(0, np.int64)
        return DeviceChanges(empty.astype(np.uint8), empty.astype(np.int32), empty.astype(_HOST[width]), n)
    gap = torch.empty_like(rank)
    order, class_major = class_major_gaps(cls_k, rank)
    gap[order] = class_major
    zs = _z(a[pos], b[pos], width)
    gap_dtype = torch.int32 if a.numel() < 1 << 31 else torch.int64
    return DeviceChanges(
        cls_k.cpu().numpy(),
        gap.to(gap_dtype).cpu().numpy(),
        zs.cpu().numpy().astype(_HOST[width]),
        n,
    )


def classes(raw: torch.Tensor, shift: int, emask: int) -> torch.Tensor:
    """(n,) uint8 exponent class of each weight, from its bit patterns (a same-width int view)."""
    return ((raw.to(torch.int32) >> shift) & emask).to(torch.uint8)


def rank_marked(
    raw: torch.Tensor, marked: torch.Tensor, shift: int, emask: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(position, class, rank within the class) of every marked weight in natural order, and every
    class's size, for the flat bit patterns `raw` (an int view) and a bool mask, slab by slab."""
    base = torch.zeros(NUM_CONTEXTS, dtype=torch.int64, device=raw.device)  # class members before this slab
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for lo in range(0, raw.numel(), SLAB):
        cls = classes(raw[lo : lo + SLAB], shift, emask)
        counts = torch.bincount(cls, minlength=NUM_CONTEXTS)
        hit = marked[lo : lo + SLAB]
        if bool(hit.any()):
            pos, c, rank = _ranked(cls, hit, counts)
            parts.append((pos + lo, c, rank + base[c.long()]))
        base += counts
    if not parts:
        none = torch.zeros(0, dtype=torch.int64, device=raw.device)
        return none, none.to(torch.uint8), none, base
    pos, c, rank = (torch.cat([p[i] for p in parts]) for i in range(3))
    return pos, c, rank, base


def positions_of(
    raw: torch.Tensor, cls: torch.Tensor, rank: torch.Tensor, shift: int, emask: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The inverse of `rank_marked`: the flat position of the member of rank `rank` in class
    `cls` for each entry, and every class's size; None if a rank is past the end of its class."""
    base = torch.zeros(NUM_CONTEXTS, dtype=torch.int64, device=raw.device)
    out = torch.full_like(rank, -1)
    c_long = cls.long()
    for lo in range(0, raw.numel(), SLAB):
        slab_cls = classes(raw[lo : lo + SLAB], shift, emask)
        counts = torch.bincount(slab_cls, minlength=NUM_CONTEXTS)
        local = rank - base[c_long]
        here = torch.nonzero((local >= 0) & (local < counts[c_long])).flatten()
        if here.numel():
            order = torch.sort(slab_cls, stable=True).indices
            start = torch.cumsum(counts, 0) - counts
            out[here] = order[start[c_long[here]] + local[here]] + lo
        base += counts
    if bool((out < 0).any()):
        return None
    return out, base


def class_major_gaps(cls: torch.Tensor, rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, gaps): `order` sorts entries class-major (natural order within a class); the gaps
    in that order are each rank minus the class's previous rank, minus 1 (the first from -1)."""
    order = torch.sort(cls, stable=True).indices
    c, r = cls[order], rank[order]
    prev = torch.cat([r.new_full((1,), -1), r[:-1]])
    first = torch.ones_like(c, dtype=torch.bool)
    first[1:] = c[1:] != c[:-1]
    prev = torch.where(first, torch.full_like(prev, -1), prev)
    return order, r - prev - 1


def _ranked(
    cls: torch.Tensor, changed: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(position, class, rank within the slab) of the slab's changes, in position order."""
    sorted_cls, perm = torch.sort(cls, stable=True)
    start = torch.cumsum(counts, 0) - counts  # first sorted index of each class
    hits = torch.nonzero(changed[perm]).flatten()  # sorted indices of the changes: class-major
    c = sorted_cls[hits]
    rank = hits - start[c.long()]
    pos = perm[hits]
    order = torch.argsort(pos)
    return pos[order], c[order], rank[order]


def _z(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    """zigzag(b - a) - 1 of bit patterns, the difference wrapping at `width` bits (int64)."""
    d = (b.long() - a.long()) & ((1 << width) - 1)
    d = torch.where(d >= 1 << (width - 1), d - (1 << width), d)
    return torch.where(d < 0, -2 * d - 1, 2 * d) - 1
