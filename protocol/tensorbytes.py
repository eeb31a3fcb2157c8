"""Raw bytes of tensors and the dtype names used on the wire.

Only fixed-width float dtypes travel; the bit patterns are viewed as unsigned integers of the
same width so that every pattern (NaN payloads, -0.0, subnormals) survives exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from protocol.errors import UnsupportedDtype

# wire name -> (torch dtype, same-width signed torch dtype, numpy unsigned view, numpy signed view)
_DTYPES: dict[str, tuple[torch.dtype, torch.dtype, type[np.unsignedinteger], type[np.signedinteger]]] = {
    "bfloat16": (torch.bfloat16, torch.int16, np.uint16, np.int16),
    "float16": (torch.float16, torch.int16, np.uint16, np.int16),
    "float32": (torch.float32, torch.int32, np.uint32, np.int32),
}
_BY_TORCH = {v[0]: k for k, v in _DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """Wire name of a supported float dtype; raises `UnsupportedDtype` for any other."""
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        raise UnsupportedDtype(f"dtype {dtype} is not supported (use bfloat16, float16 or float32)") from None


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a wire name; raises `UnsupportedDtype` for an unknown one."""
    try:
        return _DTYPES[name][0]
    except KeyError:
        raise UnsupportedDtype(f"unknown dtype name {name!r}") from None


def raw_dtype(name: str) -> np.dtype:
    """The numpy unsigned dtype that holds the bit patterns of wire dtype `name`."""
    return np.dtype(_DTYPES[name][2])


def bits(tensor: torch.Tensor) -> np.ndarray:
    """Flat unsigned-integer view of a tensor's bit patterns (a copy only if not contiguous)."""
    _, int_dtype, np_dtype, _ = _DTYPES[dtype_name(tensor.dtype)]
    flat = tensor.detach().to("cpu").contiguous().view(int_dtype).reshape(-1)
    return flat.numpy().view(np_dtype)


def on_host(tensor: torch.Tensor) -> bool:
    """Whether numpy can work on the tensor's memory directly (a CPU tensor); codecs stream
    anything else through host slabs (tests force that path on the CPU by patching this)."""
    return tensor.device.type == "cpu"


def host_slabs(tensor: torch.Tensor, lo: int, hi: int, slab: int) -> Iterator[np.ndarray]:
    """Little-endian bit-pattern views of elements [lo, hi) of the flat tensor, `slab` at a time.

    On the CPU these are views (no copy); a tensor on another device is copied to the host one
    slab at a time, so the host never holds more than two slabs of it. On CUDA the slabs go
    through two pinned buffers and the next slab's copy runs while the caller works on this
    one, so a view is valid only until the next one is asked for.
    """
    _, int_dtype, np_dtype, _ = _DTYPES[dtype_name(tensor.dtype)]
    flat = tensor.detach().reshape(-1).view(int_dtype)
    le = np.dtype(np_dtype).newbyteorder("<")
    if flat.device.type == "cuda":
        yield from _pinned_slabs(flat, lo, hi, slab, le)
        return
    for start in range(lo, hi, slab):
        piece = flat[start : min(start + slab, hi)]
        raw = piece.to("cpu").contiguous().numpy().view(np_dtype)
        yield raw.astype(le, copy=False)


def _pinned_slabs(flat: torch.Tensor, lo: int, hi: int, slab: int, le: np.dtype) -> Iterator[np.ndarray]:
    """`host_slabs` for a CUDA tensor: double-buffered copies into pinned memory, overlapped."""
    size = min(slab, max(hi - lo, 0))
    buffers = [torch.empty(size, dtype=flat.dtype, pin_memory=True) for _ in range(2)]
    done = [torch.cuda.Event(), torch.cuda.Event()]

    def issue(start: int, which: int) -> None:
        piece = flat[start : min(start + slab, hi)]
        buffers[which][: piece.numel()].copy_(piece, non_blocking=True)
        done[which].record()

    starts = list(range(lo, hi, slab))
    if starts:
        issue(starts[0], 0)
    for i, start in enumerate(starts):
        if i + 1 < len(starts):
            issue(starts[i + 1], (i + 1) % 2)
        done[i % 2].synchronize()
        n = min(start + slab, hi) - start
        yield buffers[i % 2][:n].numpy().view(le)


def from_bits(raw: np.ndarray, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Tensor of dtype `name` and `shape` whose bit patterns are the unsigned ints in `raw`."""
    dtype, _, np_dtype, np_signed = _DTYPES[name]
    signed = np.array(raw, dtype=np_dtype, copy=True).view(np_signed)  # own copy: caller may reuse raw
    return torch.from_numpy(signed).view(dtype).reshape(shape)


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """Raw little-endian bytes of a supported float tensor."""
    raw = bits(tensor)
    return raw.astype(raw.dtype.newbyteorder("<"), copy=False).tobytes()
