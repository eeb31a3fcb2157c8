"""The plain patch encoding PULSESync is measured against (never sent on the wire).

Per tensor in sorted-name order, the changed positions as int32 flat indices, delta-coded, and
the raw new values; all tensors' counts, deltas and values in one zstd frame at level 1. This is
the straightforward sparse format: no conditioning on the old weights, no entropy model.

The mask and the gathers run where the tensors are: numpy on the CPU (faster there than torch's
own ops, so the baseline is as quick as it can be), torch ops on a GPU (only the changes cross
to the host).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import zstandard

from protocol import tensorbytes
from protocol.tensorbytes import bits, dtype_name, from_bits

_SIGNED = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _changes(old: torch.Tensor, new: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(int32 flat indices, raw new values) where the bit patterns differ."""
    if tensorbytes.on_host(old):
        raw_old, raw_new = bits(old), bits(new)
        idx = np.flatnonzero(raw_old != raw_new).astype(np.int32)
        return idx, raw_new[idx]
    a, b = old.reshape(-1).view(_SIGNED[old.dtype]), new.reshape(-1).view(_SIGNED[new.dtype])
    idx_t = torch.nonzero(a != b).flatten()
    return idx_t.to(torch.int32).cpu().numpy(), b[idx_t].cpu().numpy().view(bits(old[:0].cpu()).dtype)


def encode(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> bytes:
    names = sorted(old)
    counts, deltas, vals = [], [], []
    for name in names:
        idx, values = _changes(old[name], new[name])
        counts.append(len(idx))
        deltas.append(np.diff(idx, prepend=np.int32(0)))
        vals.append(values)
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
        tensor = old[name]
        idx = np.cumsum(np.frombuffer(body[offset : offset + 4 * count], dtype="<i4"))
        offset += 4 * count
        size = count * tensor.element_size()
        raw_values = body[value_offset : value_offset + size]
        value_offset += size
        if tensorbytes.on_host(tensor):
            new_raw = bits(tensor).copy()
            new_raw[idx] = np.frombuffer(raw_values, dtype=new_raw.dtype)
            out[name] = from_bits(new_raw, dtype_name(tensor.dtype), tuple(tensor.shape))
        else:
            new = tensor.clone()
            values = torch.frombuffer(bytearray(raw_values), dtype=_SIGNED[tensor.dtype]) if count else None
            if values is not None:
                flat = new.view(-1).view(_SIGNED[tensor.dtype])
                flat[torch.from_numpy(idx.astype(np.int64)).to(tensor.device)] = values.to(tensor.device)
            out[name] = new
    return out
