"""Swappable pseudo-gradient codecs: the interface, the dense (no-op) codec, and the registry.

A miner turns its pseudo-gradient Delta (FP32, per tensor) into payload bytes; the validator
turns payload bytes back into FP32 tensors. The pattern is hivemind's `compression/base.py`
(`CompressionBase` beside `NoCompression`):

    codec = make_codec("sparseloco")
    payload, error, stats = codec.compress(delta, error, weights)   # error: the new buffer
    update = codec.decompress(payload, weights, max_bytes=cap)     # or a ProtocolError

`weights` are the BF16 global weights every node holds for the round: they give the layout
(sorted names and shapes) and PULSELoCo conditions its coding on their values.

invariant (error feedback): decompress(payload) + error_new == carried + Delta, where carried is
the part of the old buffer the codec keeps (all of it for dense and PULSELoCo, beta times it
for SparseLoCo); each codec's docstring says how exact the equality is.

Every payload starts with: 4-byte magic | u8 version | varint tensor count | 8-byte layout digest.
Decoding never allocates beyond the layout and the caller's cap, and raises a `ProtocolError`
subclass for each kind of bad input; it never modifies its arguments. Sparse positions travel as
gaps (>= 0) between ranks, so a duplicate position cannot be expressed; a position outside its
class or chunk raises `InvalidPositions`.
"""

from __future__ import annotations

import hashlib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from protocol.errors import (
    IncompatibleStates,
    LayoutMismatch,
    NonFiniteUpdate,
    NonFiniteValues,
    ProtocolError,
    SizeLimitExceeded,
    UnknownVersion,
)
from protocol.state import State
from protocol.wire import Reader, Writer

_HEADER_SLACK = 1 << 16
_DIGEST_BYTES = 8

# name -> "module:Class"; imported on first use so codec modules can import this one
REGISTRY = {
    "dense": "protocol.codec:DenseCodec",
    "pulseloco": "protocol.pulseloco:PulseLoCoCodec",
    "sparseloco": "protocol.sparseloco:SparseLoCoCodec",
}


@dataclass(frozen=True)
class CodecStats:
    """What one payload carries. `sent` counts every value on the wire, dense ones included."""

    elements: int
    sent: int
    payload_bytes: int
    position_bytes: int = 0  # the entropy-coded positions stream
    value_bytes: int = 0  # value streams and value models

    @property
    def bits_per_value(self) -> float:
        return 8 * self.payload_bytes / self.sent if self.sent else float("inf")

    @property
    def density(self) -> float:
        return self.sent / self.elements if self.elements else 0.0


class Codec(ABC):
    """A pseudo-gradient codec. Subclasses set `name`, `magic`, `version` and the two hooks."""

    name: ClassVar[str]
    magic: ClassVar[bytes]
    version: ClassVar[int]

    def compress(
        self,
        delta: State,
        error: State | None,
        weights: State,
        *,
        fraction: float = 1.0,
        handover: bool = False,
        error_dtype: torch.dtype = torch.float32,
    ) -> tuple[bytes, dict[str, torch.Tensor], CodecStats]:
        """(payload, new error buffer, stats). Reads its arguments, never modifies them, unless
        `handover`: then `delta` and `error` (dicts the caller gives up) lose each tensor as soon as the
        codec has read it, so the pseudo-gradient streams through tensor by tensor and its memory is
        freed while the new buffer fills (on a miner, 8 bytes per parameter less at the peak). Either
        way the payload is the same.

        `delta` and `error` hold FP32 or BF16 tensors (a miner may store either in BF16: `train.memory`);
        the codec works in FP32 on one tensor at a time (`carried_sum`), so a BF16 state never exists
        whole in FP32. No buffer (`error` None) is zeros made one tensor
        at a time as read. The new buffer is stored as `error_dtype` (a miner's `train.memory`), each
        tensor narrowed as soon as the codec has finished it, so it never exists whole in FP32 either.

        `fraction` in (0, 1]: send at most that share of the values the codec would send (a miner
        whose uplink cannot carry a whole payload in time); what is left out stays in the buffer.
        The payload stays within the codec's rules, so a receiver decodes it as any other. A codec
        that cannot send less (dense) ignores it.
        """
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        check_inputs(delta, error, weights)
        err: State = Zeros(weights) if error is None else ReadOnce(error) if handover else error
        if handover:
            delta = ReadOnce(delta)
        w = Writer()
        w.raw(self.magic)
        w.u8(self.version)
        w.varint(len(weights))
        w.raw(layout_digest(weights))
        new_error, stats = self._encode(w, delta, err, weights, fraction, error_dtype)
        payload = w.getvalue()
        del w  # its parts: the payload a second time
        return payload, new_error, _with_size(stats, len(payload))

    def decompress(self, payload: bytes, weights: State, *, max_bytes: int | None = None) -> dict[str, torch.Tensor]:
        """The FP32 update the payload carries, one dense tensor per name of `weights`."""
        r = self._opened(payload, weights, max_bytes, Reader)
        try:
            return self._decode(r, weights)
        except ProtocolError as exc:
            exc.body_read = r.ended
            raise

    def framing_problem(
        self, payload: bytes | memoryview, weights: State, *, max_bytes: int | None = None
    ) -> ProtocolError | None:
        """The error `decompress` raises before it has read the whole body (another codec, version or
        layout, a truncation, trailing bytes, a broken header), or None: the body is read to its end,
        no value is decoded. A validator asks it as a body arrives (`node/roles/intake.py`), so a
        payload that is not one holds no seat while the round waits."""
        try:
            self._decode(self._opened(payload, weights, max_bytes, _FramingReader), weights)
        except _BodyFramed:
            return None
        except ProtocolError as exc:
            return exc.with_traceback(None)  # its frames hold views of `payload`, which the caller may unmap
        return None  # a `_decode` that never ends its reader decoded it whole, without an error

    def _opened(
        self, payload: bytes | memoryview, weights: State, max_bytes: int | None, reader: type[Reader]
    ) -> Reader:
        """A reader past the prologue every payload starts with (magic, version, layout), checked."""
        cap = default_max_bytes(weights) if max_bytes is None else max_bytes
        if len(payload) > cap:
            raise SizeLimitExceeded(f"{self.name} payload is {len(payload)} bytes, above the cap of {cap}")
        r = reader(payload, f"{self.name} payload")
        if bytes(r.raw(len(self.magic))) != self.magic:
            raise UnknownVersion(f"not a {self.name} payload (bad magic)")
        version = r.u8()
        if version != self.version:
            raise UnknownVersion(f"{self.name} payload version {version} is not supported (speaks {self.version})")
        count = r.varint(1 << 32, "tensor count")
        if count != len(weights) or bytes(r.raw(_DIGEST_BYTES)) != layout_digest(weights):
            raise LayoutMismatch(f"{self.name} payload was made for another layout ({count} tensors)")
        return r

    def initial_error(self, weights: State) -> dict[str, torch.Tensor]:
        return zeros_like(weights)

    @abstractmethod
    def _encode(
        self, w: Writer, delta: State, error: State, weights: State, fraction: float, error_dtype: torch.dtype
    ) -> tuple[dict[str, torch.Tensor], CodecStats]:
        """Append the body (at most `fraction` of the values); return the new error buffer, each tensor
        in `error_dtype` as soon as it is done, and stats (payload_bytes filled in later). `delta` and
        `error` give FP32 or BF16 tensors, each read once (the caller's own unless handed over: only
        read them); `carried_sum` makes the FP32 tensor the codec works on."""

    @abstractmethod
    def _decode(self, r: Reader, weights: State) -> dict[str, torch.Tensor]:
        """Read the whole body (ending with `r.expect_end()`), then decode it."""


class DenseCodec(Codec):
    """Dense DiLoCo: every FP32 value of e + Delta, raw little-endian. The new buffer is zero, so the
    invariant is exact."""

    name = "dense"
    magic = b"DLOC"
    version = 1

    def _encode(
        self, w: Writer, delta: State, error: State, weights: State, fraction: float, error_dtype: torch.dtype
    ) -> tuple[dict[str, torch.Tensor], CodecStats]:
        for name in sorted(weights):  # every value, whatever `fraction`: a dense payload has no smaller form
            s = carried_sum(error[name], delta[name]).reshape(-1)
            require_finite(name, s)
            w.raw(s.cpu().numpy().astype("<f4", copy=False).tobytes())
        n = numel(weights)
        return zeros_like(weights, error_dtype), CodecStats(elements=n, sent=n, payload_bytes=0, value_bytes=4 * n)

    def _decode(self, r: Reader, weights: State) -> dict[str, torch.Tensor]:
        sections = [(name, r.raw(4 * weights[name].numel())) for name in sorted(weights)]
        r.expect_end()
        return {name: f32_tensor(np.frombuffer(raw, dtype="<f4"), weights[name], name) for name, raw in sections}


class _BodyFramed(Exception):
    """A body's framing was read to its end (`_FramingReader`): nothing is left but decoding it."""


class _FramingReader(Reader):
    """A reader that stops a decode where the body's last field has been read (`Codec.framing_problem`):
    every codec's `_decode` reads its whole body before it decodes any of it."""

    def expect_end(self) -> None:
        super().expect_end()
        raise _BodyFramed


def make_codec(name: str, **options: object) -> Codec:
    """The codec registered under `name`, built with `options` (its constructor's keywords)."""
    try:
        module, cls = REGISTRY[name].split(":")
    except KeyError:
        raise KeyError(f"unknown codec {name!r}; known: {sorted(REGISTRY)}") from None
    codec: Codec = getattr(importlib.import_module(module), cls)(**options)
    return codec


# -- helpers shared by the codecs -------------------------------------------------------------


def layout_digest(weights: State) -> bytes:
    """8 bytes naming the sorted tensor names and shapes the payload is laid out for."""
    text = ";".join(f"{name}:{tuple(weights[name].shape)}" for name in sorted(weights))
    return hashlib.sha256(text.encode()).digest()[:_DIGEST_BYTES]


def numel(weights: State) -> int:
    return sum(t.numel() for t in weights.values())


def default_max_bytes(weights: State) -> int:
    """The largest payload worth accepting: the dense FP32 size plus header slack."""
    return 4 * numel(weights) * 11 // 10 + _HEADER_SLACK


def zeros_like(weights: State, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    return {name: torch.zeros(t.shape, dtype=dtype) for name, t in weights.items()}


class Zeros(Mapping[str, torch.Tensor]):
    """No error buffer yet (a first round): zeros shaped like each weight, made when read (BF16: they
    are exact), so a whole zero state never exists at once."""

    def __init__(self, weights: State) -> None:
        self._weights = weights

    def __getitem__(self, name: str) -> torch.Tensor:
        weight = self._weights[name]
        return torch.zeros(weight.shape, dtype=torch.bfloat16, device=weight.device)

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)


class ReadOnce(Mapping[str, torch.Tensor]):
    """A state handed over to a codec: reading a tensor takes it out (each is read once), so the
    caller's dict frees it as the codec moves on."""

    def __init__(self, state: State) -> None:
        if not isinstance(state, dict):
            raise TypeError("a handed-over state is a dict the codec may empty")
        self._state: dict[str, torch.Tensor] = state
        self._names = tuple(state)

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._state.pop(name)
        except KeyError:
            raise KeyError(f"{name}: a handed-over tensor is read once") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


SUM_CHUNK = 1 << 22  # elements: the FP32 widening of BF16 inputs exists for one chunk (16 MiB) at a time


def carried_sum(error: torch.Tensor, delta: torch.Tensor, beta: float | None = None) -> torch.Tensor:
    """A new FP32 tensor `error + delta` (`beta * error + delta` with `beta`), from FP32 or BF16 inputs,
    filled SUM_CHUNK elements at a time: widening whole BF16 tensors first would add 8 bytes per
    element of the largest tensor beside the sum. Bit for bit the whole-tensor expression in FP32."""
    out = torch.empty(delta.shape, dtype=torch.float32, device=delta.device)
    flat, e, d = out.view(-1), error.reshape(-1), delta.reshape(-1)
    for at in range(0, flat.numel(), SUM_CHUNK):
        part = e[at : at + SUM_CHUNK].float()
        torch.add(part if beta is None else part * beta, d[at : at + SUM_CHUNK].float(), out=flat[at : at + SUM_CHUNK])
    return out


def check_inputs(delta: State, error: State | None, weights: State) -> None:
    """Raise unless delta (and error) are FP32 or BF16 (`Codec.compress` widens them one tensor at a
    time) with the weights' names and shapes. Finiteness is
    checked by each codec on the sum it forms (`require_finite`), which is NaN or inf whenever
    either part is, so the inputs are not read one more time for it."""
    for label, state in (("delta", delta), ("error", error)):
        if state is None:
            continue
        if set(state) != set(weights):
            raise IncompatibleStates(f"{label} names differ from the weights': {sorted(set(state) ^ set(weights))[:5]}")
        for name, t in state.items():
            if t.dtype not in (torch.float32, torch.bfloat16) or t.shape != weights[name].shape:
                raise IncompatibleStates(
                    f"{label} {name}: {t.dtype}{tuple(t.shape)}, weights are {tuple(weights[name].shape)}"
                )


def require_finite(name: str, t: torch.Tensor, magnitude: torch.Tensor | None = None) -> None:
    """Raise NonFiniteUpdate if the error buffer plus pseudo-gradient `t` has NaN or inf values.
    `magnitude`: |t| if the caller has it already. Reductions only (max and min propagate NaN; an
    inf is one of them): no temporary the size of `t`."""
    if not t.numel():
        return
    ends = (magnitude.max(),) if magnitude is not None else torch.aminmax(t)
    if not all(bool(torch.isfinite(end)) for end in ends):
        raise NonFiniteUpdate(f"{name}: the error buffer plus pseudo-gradient has NaN or inf values")


def f32_zeros(n: int, device: torch.device) -> torch.Tensor:
    """(n,) FP32 zeros on `device` for a sparse update to be scattered into. On the CPU from numpy's
    calloc: pages are zeroed as they are first touched, not all in advance (torch.zeros writes them)."""
    if device.type == "cpu":
        return torch.from_numpy(np.zeros(n, dtype=np.float32))
    return torch.zeros(n, dtype=torch.float32, device=device)


def f32_tensor(flat: np.ndarray, like: torch.Tensor, name: str, *, owned: bool = False) -> torch.Tensor:
    """A finite FP32 tensor shaped like `like` from decoded values (copied unless `owned`: a fresh
    array nothing else refers to)."""
    if not np.isfinite(flat).all():
        raise NonFiniteValues(f"{name}: NaN or inf in the payload")
    data = flat if owned and flat.dtype == np.float32 else np.array(flat, dtype=np.float32)
    return torch.from_numpy(data).reshape(like.shape)


def write_words(w: Writer, words: np.ndarray) -> None:
    """An entropy-coded stream (ans.py): varint words | u16 words. One copy (the bytes the writer
    keeps): a stream is most of a payload, hundreds of MB on a miner."""
    w.varint(words.size)
    w.raw(np.ascontiguousarray(words, dtype="<u2").tobytes())


def read_words(r: Reader) -> np.ndarray:
    # the count only bounds a view of bytes already in hand: a short payload is truncated, not oversized
    return r.u16_array(r.varint(1 << 40, "stream words"))


def _with_size(stats: CodecStats, size: int) -> CodecStats:
    return CodecStats(stats.elements, stats.sent, size, stats.position_bytes, stats.value_bytes)
