"""Sparse positions coded as gaps between ranks within each context class.

Inside one (tensor, context) class of n positions with k changed, changes are close to a
Bernoulli(k/n) process, so the gaps between consecutive ranks are geometric. Each gap g is
split Golomb-style into q = g // m and r = g % m: r is uniform on [0, m) and q is geometric
with ratio theta = (1 - k/n)**m. m is derived from (n, k) with integers only; the encoder
fits theta to the actual q values and sends it as one byte (theta = t/256). With m chosen
so theta is near 0.85, the uniform approximation inside each bucket costs ~0.003 bit/gap.

Layout of the streams (decode order): q symbols grouped by theta (ascending), then escapes
for q >= Q_ESCAPE (two 16-bit pieces each), then remainders. Classes whose k equals n are
implied entirely by their header and cost nothing in the stream.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from protocol.ans import UNIFORM_MAX, AnsDecoder, AnsEncoder, geometric_weights
from protocol.contexts import NUM_CONTEXTS
from protocol.errors import InvalidPositions, MalformedPayload
from protocol.wire import Reader, Writer

Q_ESCAPE = 64  # q symbols 0..63 are literal, 64 means "q - 64 follows in the escape stream"
M_CAP = 1 << 23  # remainders stay below constriction's uniform-size limit
MAX_CLASS_SIZE = (1 << 32) - 1  # escapes carry q - 64 in two 16-bit pieces


def golomb_m(n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Bucket width per class: about 0.1625 * n / k, so that (1 - k/n)**m is about 0.85."""
    return np.clip((13 * n) // (80 * np.maximum(k, 1)), 1, M_CAP).astype(np.int64)


def fit_theta(q: np.ndarray) -> int:
    """Maximum-likelihood geometric ratio for the observed q values, as t/256 with t in 1..255."""
    mean = float(q.mean()) if q.size else 0.0
    return int(min(255, max(1, round(256 * mean / (1 + mean)))))


def split_gaps(sorted_idx: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Class of each sorted index and the gap to the previous change of the same class.

    `sorted_idx` ascending; `starts`/`counts` describe the class-major order (see contexts.py).
    """
    ends = starts + counts
    cls = np.searchsorted(ends, sorted_idx, side="right")
    prev = np.empty_like(sorted_idx)
    prev[1:] = sorted_idx[:-1]
    first = np.ones(sorted_idx.shape, dtype=bool)
    first[1:] = cls[1:] != cls[:-1]
    prev[first] = starts[cls[first]] - 1
    return cls, sorted_idx - prev - 1


def join_gaps(gaps: np.ndarray, class_start: np.ndarray, class_count: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Inverse of `split_gaps`: sorted indices from per-class gaps.

    `class_start`, `class_count`, `k`: per active class, in order; gaps are class-major.
    Raises InvalidPositions if any rank falls outside its class.
    """
    if np.any(gaps >= np.repeat(class_count, k)):
        raise InvalidPositions("a gap is longer than its whole class")
    steps = gaps + 1
    total = np.cumsum(steps)
    first_change = np.concatenate(([0], np.cumsum(k)[:-1]))
    base = np.zeros(len(k), dtype=np.int64)
    base[1:] = total[first_change[1:] - 1]  # running total before each class's first change
    last_rank = total[first_change + k - 1] - base - 1
    if np.any(last_rank >= class_count):
        bad = int(np.argmax(last_rank >= class_count))
        raise InvalidPositions(
            f"class {bad}: rank {int(last_rank[bad])} is outside a class of {int(class_count[bad])} positions"
        )
    per_change_offset = np.repeat(class_start - 1 - base, k)
    return total + per_change_offset


def encode_gaps(enc: AnsEncoder, gaps: np.ndarray, m: np.ndarray, theta: np.ndarray) -> None:
    """Queue the gaps (per change: bucket width m, theta byte; theta 0 = implied, not coded)."""
    coded = theta > 0
    gaps, m, theta = gaps[coded], m[coded], theta[coded]
    q = gaps // m
    by_theta = np.argsort(theta, kind="stable")
    sym = np.minimum(q, Q_ESCAPE)
    for t, group in _groups(theta, by_theta):
        enc.categorical(sym[group], geometric_weights(t, Q_ESCAPE + 1))
    extra = q[q >= Q_ESCAPE] - Q_ESCAPE
    pieces = np.stack([extra >> 16, extra & 0xFFFF], axis=1).reshape(-1)
    enc.uniform(pieces, np.full(pieces.shape, UNIFORM_MAX))
    enc.uniform(gaps % m, m)


def decode_gaps(dec: AnsDecoder, m: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Inverse of `encode_gaps` for changes with the given m and theta (implied ones get 0)."""
    gaps = np.zeros(m.shape, dtype=np.int64)
    coded = theta > 0
    m_c, theta_c = m[coded], theta[coded]
    q = np.zeros(m_c.shape, dtype=np.int64)
    by_theta = np.argsort(theta_c, kind="stable")
    for t, group in _groups(theta_c, by_theta):
        q[group] = dec.categorical(len(group), geometric_weights(t, Q_ESCAPE + 1))
    escaped = q >= Q_ESCAPE
    pieces = dec.uniform(np.full(2 * int(escaped.sum()), UNIFORM_MAX)).reshape(-1, 2)
    q[escaped] += (pieces[:, 0] << 16) | pieces[:, 1]
    gaps[coded] = q * m_c + dec.uniform(m_c)
    return gaps


def _groups(keys: np.ndarray, order: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(key, indices) for each distinct key, ascending, indices in original order."""
    sorted_keys = keys[order]
    cuts = np.flatnonzero(np.diff(sorted_keys)) + 1
    return [(int(sorted_keys[idx[0]]), order[idx]) for idx in np.split(np.arange(len(order)), cuts) if len(idx)]


def log2_binomial(n: int, k: int) -> float:
    """log2 C(n, k): the bits any coder needs for which k of n positions changed."""
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


@dataclass
class ClassTable:
    """One tensor's marked positions, grouped by context class, and their gap-code parameters."""

    classes: np.ndarray  # active context ids, ascending
    k: np.ndarray  # marked positions per active class
    n: np.ndarray  # size of each active class
    theta: np.ndarray  # per active class, 0 = every position of the class is marked
    m: np.ndarray  # Golomb bucket width per active class

    @property
    def position_bits(self) -> float:
        """log2 C(n, k) summed over the classes: the positions' information content."""
        return sum(log2_binomial(int(a), int(b)) for a, b in zip(self.n, self.k, strict=True))


def build_table(sorted_idx: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> tuple[ClassTable, np.ndarray]:
    """The class table and per-position gaps (class-major) for ascending sorted indices."""
    cls, gaps = split_gaps(sorted_idx, starts, counts)
    k_by_class = np.bincount(cls, minlength=len(counts))
    classes = np.flatnonzero(k_by_class)
    k, n = k_by_class[classes], counts[classes]
    m = golomb_m(n, k)
    local = np.repeat(np.arange(len(classes)), k)
    q_mean = np.bincount(local, weights=gaps // m[local], minlength=len(classes)) / np.maximum(k, 1)
    theta = np.where(k == n, 0, np.clip(np.rint(256 * q_mean / (1 + q_mean)), 1, 255)).astype(np.int64)
    return ClassTable(classes, k, n, theta, m), gaps


def write_table(w: Writer, table: ClassTable) -> None:
    """varint classes; per class: varint context delta, varint k, u8 theta."""
    w.varint(len(table.classes))
    prev = -1
    for c, k, t in zip(table.classes.tolist(), table.k.tolist(), table.theta.tolist(), strict=True):
        w.varint(c - prev - 1)
        w.varint(k)
        w.u8(t)
        prev = c


def read_table(r: Reader, name: str, numel: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of `write_table`: (classes, k, theta), checked against the header's own bounds.
    `check_table` then checks them against the receiver's class sizes."""
    rows = []
    cls = -1
    for _ in range(r.varint(NUM_CONTEXTS, f"{name} class count")):
        cls += 1 + r.varint(NUM_CONTEXTS, f"{name} context delta")
        if cls >= NUM_CONTEXTS:
            raise MalformedPayload(f"{name}: context {cls} out of range")
        k = r.varint(numel, f"{name} marked positions in context {cls}")
        if k == 0:
            raise MalformedPayload(f"{name}: context {cls} is listed with no marked position")
        rows.append((cls, k, r.u8()))
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def check_table(name: str, classes: np.ndarray, k: np.ndarray, theta: np.ndarray, counts: np.ndarray) -> ClassTable:
    """The table a header claims, against the receiver's own class sizes `counts` (per context)."""
    n = counts[classes].astype(np.int64)
    if np.any(k > n):
        raise InvalidPositions(f"{name}: more positions than an exponent class holds")
    if np.any((theta == 0) != (k == n)):
        raise MalformedPayload(f"{name}: theta 0 must mark exactly the fully marked classes")
    return ClassTable(classes, k, n, theta, golomb_m(n, k))


def _per_position(tables: Sequence[ClassTable]) -> tuple[np.ndarray, np.ndarray]:
    """Bucket width m and theta of every marked position, tables in order, classes class-major."""
    k = np.concatenate([t.k for t in tables])
    return np.repeat(np.concatenate([t.m for t in tables]), k), np.repeat(np.concatenate([t.theta for t in tables]), k)


def encode_tables(enc: AnsEncoder, tables: Sequence[ClassTable], gaps: Sequence[np.ndarray]) -> None:
    """Queue the gaps of several tensors, each described by its table, as one gap stream."""
    if tables:
        encode_gaps(enc, np.concatenate(list(gaps)), *_per_position(tables))


def decode_tables(dec: AnsDecoder, tables: Sequence[ClassTable]) -> np.ndarray:
    """Inverse of `encode_tables`: all tensors' gaps, concatenated in table order."""
    if not tables:
        return np.zeros(0, dtype=np.int64)
    return decode_gaps(dec, *_per_position(tables))
