"""Entropy coding with asymmetric numeral systems (the `constriction` package), bounded and typed.

ANS is a stack: symbols are encoded in the reverse of the order they are decoded. `AnsEncoder`
therefore queues segments in *decode* order and encodes them backwards in `finish()`, so format
code reads top to bottom the same way for both directions.

Every model is built from integer weights. constriction quantizes the float copies of those
integers the same way everywhere, so encoder and decoder can never disagree on a table.
"""

from __future__ import annotations

from functools import lru_cache

import constriction
import numpy as np

from protocol.errors import MalformedPayload, TrailingBytes
from protocol.wire import Reader, Writer

_model = constriction.stream.model
UNIFORM_MAX = 1 << 16  # sizes of one uniform symbol stay far below constriction's 2**24 limit


def categorical(weights: np.ndarray) -> object:
    """A categorical model over range(len(weights)); zero weights still get the minimum probability."""
    return _model.Categorical(np.asarray(weights, dtype=np.float64), perfect=False)


@lru_cache(maxsize=512)
def geometric_weights(theta_256: int, alphabet: int) -> np.ndarray:
    """Integer weights of a geometric law with ratio theta_256/256, truncated to `alphabet` - 1
    symbols plus an escape symbol carrying the whole tail. Exact integer arithmetic."""
    if not 0 < theta_256 < 256:
        raise ValueError(f"theta_256 must be in 1..255, got {theta_256}")
    w = [1 << 40]
    for _ in range(alphabet - 2):
        w.append(w[-1] * theta_256 >> 8)
    head = [x * (256 - theta_256) >> 8 for x in w]
    tail = w[-1] * theta_256 >> 8  # mass of q >= alphabet - 1 under the same law
    weights = np.array([*head, tail], dtype=np.float64)
    weights.setflags(write=False)
    return weights


class AnsEncoder:
    def __init__(self) -> None:
        self._segments: list[tuple[np.ndarray, object, np.ndarray | None]] = []

    def categorical(self, symbols: np.ndarray, weights: np.ndarray) -> None:
        if symbols.size:
            self._segments.append((symbols.astype(np.int32, copy=False), categorical(weights), None))

    def uniform(self, values: np.ndarray, sizes: np.ndarray) -> None:
        """Each value[i] uniform in range(sizes[i]); sizes of 1 carry no information and are skipped."""
        keep = sizes > 1
        if keep.any():
            self._segments.append((values[keep].astype(np.int32), _model.Uniform(), sizes[keep].astype(np.int32)))

    def finish(self) -> np.ndarray:
        """The compressed words (uint32)."""
        coder = constriction.stream.stack.AnsCoder()
        for symbols, model, params in reversed(self._segments):
            if params is None:
                coder.encode_reverse(symbols, model)
            else:
                coder.encode_reverse(symbols, model, params)
        return np.asarray(coder.get_compressed(), dtype=np.uint32)


class AnsDecoder:
    def __init__(self, words: np.ndarray) -> None:
        try:
            self._coder = constriction.stream.stack.AnsCoder(np.ascontiguousarray(words, dtype=np.uint32))
        except ValueError as exc:
            raise MalformedPayload(f"entropy-coded section is invalid: {exc}") from exc

    def categorical(self, count: int, weights: np.ndarray) -> np.ndarray:
        if count == 0:
            return np.zeros(0, dtype=np.int32)
        return self._decode(categorical(weights), count)

    def uniform(self, sizes: np.ndarray) -> np.ndarray:
        out = np.zeros(sizes.shape, dtype=np.int64)
        keep = sizes > 1
        if keep.any():
            out[keep] = self._decode(_model.Uniform(), sizes[keep].astype(np.int32))
        return out

    def _decode(self, model: object, arg: object) -> np.ndarray:
        try:
            return np.asarray(self._coder.decode(model, arg))
        except (ValueError, RuntimeError, OverflowError) as exc:
            raise MalformedPayload(f"entropy-coded section does not decode: {exc}") from exc

    def finish(self) -> None:
        """Every word must have been consumed: leftover state means bytes nobody accounts for."""
        if not self._coder.is_empty():
            raise TrailingBytes("entropy-coded section has data left after the last symbol")


def write_histograms(w: Writer, keys: np.ndarray, counts: np.ndarray) -> None:
    """Model tables: varint models; per model: varint key delta, varint symbols, per symbol
    varint symbol delta and varint count. Keys ascending; rows of `counts` are histograms."""
    w.varint(len(keys))
    prev = -1
    for key, row in zip(keys.tolist(), counts, strict=True):
        w.varint(key - prev - 1)
        prev = key
        nz = np.flatnonzero(row)
        w.varint(len(nz))
        prev_sym = -1
        for s in nz.tolist():
            w.varint(s - prev_sym - 1)
            w.varint(int(row[s]))
            prev_sym = s


def read_histograms(
    r: Reader, *, max_key: int, alphabet: int, max_count: int, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `write_histograms`: keys (ascending, <= max_key) and (models, alphabet) counts."""
    n = r.varint(max_key + 1, f"{what} count")
    keys = np.zeros(n, dtype=np.int64)
    counts = np.zeros((n, alphabet), dtype=np.int64)
    key = -1
    for i in range(n):
        key += 1 + r.varint(max_key + 1, f"{what} key delta")
        if key > max_key:
            raise MalformedPayload(f"{what} key {key} out of range")
        keys[i] = key
        sym = -1
        for _ in range(r.varint(alphabet, f"{what} symbols")):
            sym += 1 + r.varint(alphabet, f"{what} symbol delta")
            if sym >= alphabet:
                raise MalformedPayload(f"{what} {key}: symbol {sym} out of range")
            counts[i, sym] = r.varint(max_count, f"{what} symbol count")
    return keys, counts
