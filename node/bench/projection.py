"""Memory of each role at other model sizes, projected from what `pulse bench scale` measured.

Bytes that belong to parameters (weights, gradients, optimizer state, error feedback, the
validator's master and buffers, the follower's state) scale with the parameter count. A miner's
activations scale with the tokens of a step and the model's width and depth: with activation
checkpointing, each block's input (tokens x hidden, per layer) stays, plus one block's full
activations while it is recomputed. The chunked loss adds one chunk of logits (tokens x vocab).
Every input is a measurement at the measured size except the two constants below, named as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.learn.hfmodel import ARCHITECTURES, LOSS_CHUNK_TOKENS, count_hf_parameters
from node.learn.train import MemoryConfig

GIB = 2**30
AUTOCAST_CACHE_BYTES = 2  # per parameter: autocast's BF16 weight copies, when its cache is on (no checkpointing)
LOSS_CHUNK_TENSORS = 4  # FP32 (chunk, vocab) tensors alive in one loss chunk's backward: logits, softmax, grads
CUDA_CONTEXT_GIB = 1.0  # what the CUDA context and its kernels take outside the allocator
FRAGMENTATION_GIB = 1.0  # allocator slack a projection of allocated bytes leaves for (a measurement reads reserved)
CARD_GIB = 24.0
BF16_BYTES = 2  # the global weights every node holds


@dataclass(frozen=True)
class Shape:
    name: str
    params: int
    layers: int
    hidden: int
    vocab: int

    @classmethod
    def of(cls, name: str, config: dict[str, Any] | None = None) -> Shape:
        """The shape of a built-in architecture, or of `config` (a config.json as a dict) named `name`."""
        cfg = config if config is not None else ARCHITECTURES[name]
        return cls(name, count_hf_parameters(cfg), cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"])


@dataclass(frozen=True)
class Measured:
    """Per-parameter and per-token costs measured at `shape`."""

    shape: Shape
    state_bpp: float  # miner device: weights + gradients + optimizer state
    autocast_cache: bool  # the miner runs BF16 autocast with its weight cache on
    saved_per_token: float  # activations kept for backward per token (with the run's checkpointing)
    block_per_token: float  # one block's full activations per token (0 without checkpointing)
    host_bpp: float  # miner host: BF16 global weights, error buffer, delta, codec work
    validator_bpp: float  # validator's own peak (host) per parameter
    validator_device_bpp: float  # its evaluation model on the device (CUDA), per parameter
    follower_bpp: float  # follower: held state plus what applying a patch takes
    codec_bpp: float = 0.0  # miner host: the codec's own peak above the weights, buffer and pseudo-gradient


@dataclass(frozen=True)
class Projection:
    shape: Shape
    miner_device_gib: float
    miner_host_gib: float
    validator_gib: float
    validator_device_gib: float
    follower_gib: float

    @property
    def fits_24gb(self) -> bool:
        return self.miner_device_gib + CUDA_CONTEXT_GIB + FRAGMENTATION_GIB <= CARD_GIB


def miner_device_bytes(m: Measured, shape: Shape, tokens: int) -> float:
    depth_width = (shape.layers * shape.hidden) / (m.shape.layers * m.shape.hidden)
    activations = tokens * (m.saved_per_token * depth_width + m.block_per_token * shape.hidden / m.shape.hidden)
    loss_chunk = LOSS_CHUNK_TENSORS * min(tokens, LOSS_CHUNK_TOKENS) * shape.vocab * 4
    cache = AUTOCAST_CACHE_BYTES * shape.params if m.autocast_cache else 0
    return m.state_bpp * shape.params + cache + activations + loss_chunk


def miner_host_bpp(m: Measured, memory: MemoryConfig | None) -> float:
    """A miner's host bytes per parameter at compress: as measured, or with the error buffer and the
    pseudo-gradient stored as `memory` says (another preset's settings) beside the BF16 weights and
    the codec's measured peak."""
    if memory is None:
        return m.host_bpp
    return BF16_BYTES + memory.error_dtype.itemsize + memory.delta_dtype.itemsize + m.codec_bpp


def project(m: Measured, shape: Shape, tokens: int, memory: MemoryConfig | None = None) -> Projection:
    """Each role's memory at `shape` for a miner step of `tokens` tokens (`memory`: the miner's host
    with these settings instead of the measured ones)."""
    return Projection(
        shape=shape,
        miner_device_gib=miner_device_bytes(m, shape, tokens) / GIB,
        miner_host_gib=miner_host_bpp(m, memory) * shape.params / GIB,
        validator_gib=m.validator_bpp * shape.params / GIB,
        validator_device_gib=m.validator_device_bpp * shape.params / GIB,
        follower_gib=m.follower_bpp * shape.params / GIB,
    )


def fits_measured(reserved_peak_mb: float) -> bool:
    """A measured run fits a 24 GB card if the allocator's reserved peak plus the CUDA context does."""
    return reserved_peak_mb / 1024 + CUDA_CONTEXT_GIB <= CARD_GIB
