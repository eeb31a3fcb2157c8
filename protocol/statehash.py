"""Canonical SHA-256 of a state dict: what every node compares to know it holds the same weights.

Hashed, in sorted-name order, for each tensor: name, dtype, shape, raw little-endian bytes.
Each field is length-prefixed so that no two different states share a preimage.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping

import torch

from protocol.tensorbytes import dtype_name, tensor_bytes

DOMAIN = b"pulse/state/v1\x00"


def _field(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def state_hash(state: Mapping[str, torch.Tensor]) -> str:
    """Hex SHA-256 of `state`, independent of dict order and of tensor strides or device."""
    h = hashlib.sha256(DOMAIN)
    h.update(struct.pack("<Q", len(state)))
    for name in sorted(state):
        tensor = state[name]
        h.update(_field(name.encode()))
        h.update(_field(dtype_name(tensor.dtype).encode()))
        h.update(_field(struct.pack(f"<{tensor.dim()}Q", *tensor.shape)))
        h.update(_field(tensor_bytes(tensor)))
    return h.hexdigest()
