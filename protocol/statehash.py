"""Canonical SHA-256 commitment to a state dict, built from per-chunk digests (version 2).

What every node compares to know it holds the same weights. Each tensor's raw little-endian
bytes are cut into CHUNK_BYTES pieces (the last one shorter; an empty tensor has none), and

    chunk digest = SHA-256(CHUNK_DOMAIN || chunk bytes)
    state hash   = SHA-256(DOMAIN || u64 tensor count || per tensor, in sorted-name order:
                           field(name) field(dtype) field(u64 shape...) u64 chunk count
                           || its chunk digests)

where field(x) = u64 len(x) || x. Why this is still a collision-resistant commitment to the
whole state: the root preimage is an unambiguous encoding (every variable-length part is
length-prefixed and the chunk count is explicit) of the layout and the digest list, and the
layout fixes every chunk boundary. Two different states with the same hash would need either
two different root preimages with one SHA-256 digest, or one preimage and therefore one
digest list, where some chunk differs yet hashes alike: a SHA-256 collision either way. The
domain strings keep chunk digests and roots from ever being confused with each other or with
version 1's whole-state digest.

Chunks hash independently, so the hash runs on all cores (`parallel.py`), a receiver that
just produced a tensor hashes it while it is still in cache, and `StateDigests` lets a node
check each piece of a checkpoint as it arrives from any of several peers (`verify_piece`),
then the list against the announced root (`StateDigests.root`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from protocol.parallel import parallel_map
from protocol.tensorbytes import dtype_name, host_slabs

VERSION = 2
DOMAIN = b"pulse/state/v2\x00"
CHUNK_DOMAIN = b"pulse/state-chunk/v2\x00"
CHUNK_BYTES = 1 << 20
_TASK_BYTES = 32 * CHUNK_BYTES  # one unit of parallel work (and of host memory for a GPU tensor)


def _field(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def chunk_digest(data: bytes | memoryview) -> bytes:
    """SHA-256 of one chunk's bytes under the chunk domain."""
    h = hashlib.sha256(CHUNK_DOMAIN)
    h.update(data)  # hashlib releases the GIL above 2 KiB
    return h.digest()


def digest_bytes(raw: np.ndarray) -> list[bytes]:
    """Chunk digests of a flat little-endian byte view (chunk boundaries from its start)."""
    flat = raw.view(np.uint8)
    return [chunk_digest(flat[i : i + CHUNK_BYTES].data) for i in range(0, len(flat), CHUNK_BYTES)]


@dataclass(frozen=True)
class TensorDigests:
    """One tensor's layout and its chunk digests."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[bytes, ...]

    def preimage(self) -> bytes:
        head = _field(self.name.encode()) + _field(self.dtype.encode())
        head += _field(struct.pack(f"<{len(self.shape)}Q", *self.shape)) + struct.pack("<Q", len(self.chunks))
        return head + b"".join(self.chunks)


@dataclass(frozen=True)
class StateDigests:
    """Every chunk digest of a state, in sorted-name order: enough to verify any piece alone."""

    tensors: tuple[TensorDigests, ...]

    def root(self) -> str:
        """The state hash (hex)."""
        h = hashlib.sha256(DOMAIN)
        h.update(struct.pack("<Q", len(self.tensors)))
        for t in self.tensors:
            h.update(t.preimage())
        return h.hexdigest()

    def pieces(self) -> Iterator[tuple[str, int, int, bytes]]:
        """(tensor name, byte offset, byte length, digest) of every chunk."""
        for t in self.tensors:
            nbytes = int(np.prod(t.shape, dtype=np.int64)) * _ITEMSIZE[t.dtype]
            for i, d in enumerate(t.chunks):
                yield t.name, i * CHUNK_BYTES, min(CHUNK_BYTES, nbytes - i * CHUNK_BYTES), d


_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


def verify_piece(digests: StateDigests, name: str, offset: int, data: bytes | memoryview) -> bool:
    """Whether `data` is exactly the chunk of tensor `name` starting at byte `offset`."""
    for t in digests.tensors:
        if t.name == name and offset % CHUNK_BYTES == 0 and offset // CHUNK_BYTES < len(t.chunks):
            return chunk_digest(data) == t.chunks[offset // CHUNK_BYTES]
    return False


def tensor_digests(name: str, tensor: torch.Tensor, chunks: Sequence[bytes]) -> TensorDigests:
    return TensorDigests(name, dtype_name(tensor.dtype), tuple(tensor.shape), tuple(chunks))


def _tasks(state: Mapping[str, torch.Tensor]) -> list[tuple[str, int, int]]:
    """(name, first element, end element) pieces of about _TASK_BYTES, on chunk boundaries."""
    tasks = []
    for name in sorted(state):
        t = state[name]
        per_task = _TASK_BYTES // t.element_size()
        tasks += [(name, lo, min(lo + per_task, t.numel())) for lo in range(0, t.numel(), per_task)]
    return tasks


def state_digests(state: Mapping[str, torch.Tensor]) -> StateDigests:
    """All chunk digests of `state`, computed on all cores; works for tensors on any device."""

    def run(task: tuple[str, int, int]) -> list[bytes]:
        name, lo, hi = task
        return [d for raw in host_slabs(state[name], lo, hi, hi - lo) for d in digest_bytes(raw)]

    tasks = _tasks(state)
    results = parallel_map(run, tasks)
    per_name: dict[str, list[bytes]] = {name: [] for name in state}
    for (name, _, _), digests in zip(tasks, results, strict=True):
        per_name[name] += digests
    return StateDigests(tuple(tensor_digests(n, state[n], per_name[n]) for n in sorted(state)))


def state_hash(state: Mapping[str, torch.Tensor]) -> str:
    """Hex hash of `state`, independent of dict order and of tensor strides or device."""
    return state_digests(state).root()
