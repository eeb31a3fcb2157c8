"""The plain patch encoding PULSESync is measured against (never sent on the wire).

Per tensor in sorted-name order, the changed positions as int32 flat indices, delta-coded, and
the raw new values; all tensors' counts, deltas and values in one zstd frame at level 1. This is
the straightforward sparse format: no conditioning on the old weights, no entropy model.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import zstandard

from protocol.tensorbytes import bits, dtype_name, from_bits


def encode(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> bytes:
    names = sorted(old)
    counts, deltas, vals = [], [], []
    for name in names:
        raw_old, raw_new = bits(old[name]), bits(new[name])
        idx = np.flatnonzero(raw_old != raw_new).astype(np.int32)
        counts.append(len(idx))
        deltas.append(np.diff(idx, prepend=np.int32(0)))
        vals.append(raw_new[idx])
    body = np.array(counts, dtype="<i4").tobytes() + b"".join(d.tobytes() for d in deltas)
    body += b"".join(v.tobytes() for v in vals)
    return zstandard.ZstdCompressor(level=1).compress(body)


def apply(old: Mapping[str, torch.Tensor], patch: bytes) -> dict[str, torch.Tensor]:
    names = sorted(old)
    cap = 4 * len(names) + sum(t.numel() * (4 + t.element_size()) for t in old.values())
    body = memoryview(zstandard.ZstdDecompressor().decompress(patch, max_output_size=cap))
    counts = np.frombuffer(body[: 4 * len(names)], dtype="<i4")
    offset = 4 * len(names)
    out: dict[str, torch.Tensor] = {}
    value_offset = offset + 4 * int(counts.sum())
    for name, count in zip(names, counts.tolist(), strict=True):
        raw = bits(old[name])
        idx = np.cumsum(np.frombuffer(body[offset : offset + 4 * count], dtype="<i4"))
        offset += 4 * count
        size = count * raw.itemsize
        new_raw = raw.copy()
        new_raw[idx] = np.frombuffer(body[value_offset : value_offset + size], dtype=raw.dtype)
        value_offset += size
        out[name] = from_bits(new_raw, dtype_name(old[name].dtype), tuple(old[name].shape))
    return out
