"""The codec parameters a run fixes, and the one place a run's codec is built from them.

    codec = build_codec("sparseloco", CodecOptions(k=32))

Each codec reads only its own fields (PULSELoCo: `value_format`; SparseLoCo: `k`, `beta`); the
dense codec has none. The chunk geometry (64x64 tiles, runs of 4096) and SparseLoCo's 4 value
bins over mean +- 3 std are fixed by the payload format, so they are not options.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from protocol.codec import Codec, DenseCodec, make_codec
from protocol.parsing import STRICT
from protocol.pulseloco import PulseLoCoCodec
from protocol.sparseloco import CHUNK, SparseLoCoCodec


class CodecOptions(BaseModel):
    """Constructor settings of the run's pseudo-gradient codec; miners and validators build the same one."""

    model_config = STRICT

    value_format: Literal["bf16", "fp32"] = "bf16"
    """PULSELoCo: precision of the sent values (BF16 mantissa, or full FP32)."""
    k: int = Field(default=64, ge=1, le=CHUNK)
    """SparseLoCo: values sent per 4096-element chunk (top-k by magnitude)."""
    beta: float = Field(default=0.95, ge=0, le=1)
    """SparseLoCo: decay of the error-feedback buffer before the new pseudo-gradient is added."""


def build_codec(name: str, options: CodecOptions) -> Codec:
    """The codec registered under `name`, with the fields of `options` that codec takes."""
    if name == "pulseloco":
        return PulseLoCoCodec(value_format=options.value_format)
    if name == "sparseloco":
        return SparseLoCoCodec(k=options.k, beta=options.beta)
    if name == "dense":
        return DenseCodec()
    return make_codec(name)  # a registered codec without options (KeyError if unknown)
