"""SparseLoCo (Templar): top-k per 4096-element chunk, 2-bit values, error feedback.

Per tensor, with Delta the FP32 pseudo-gradient and e the FP32 buffer (beta 0.95 by default):

    acc = beta * e + Delta
    chunks: 2-D tensors whose sides are multiples of 64 as 64x64 tiles, others as runs of 4096
    top-k |acc| per chunk (k = 64); the picked values go into 4 bins over mean +- 3 std of the
    picked values (per tensor), each decoding to its bin's mean (centroid)
    e_new = acc - sent at the picked positions, acc elsewhere
    1-D tensors (gains, biases) are sent dense, rounded to BF16, the rounding residual kept in e

invariant: e_new == acc - sent evaluated in FP32, bit for bit. At 1-D and unpicked positions
that is exact; at picked ones acc - centroid is one FP32 rounding (half an ulp of the residual)
from the real difference, as no 4-value codebook can make every residual representable.

Positions are gaps within each chunk (positions.py, one geometric ratio per tensor): ~7.45 bits
against the log2 C(4096, 64) / 64 = 7.36-bit bound; bins are entropy-coded with their counts
(~2 bits); Templar ships 12-bit indices plus a byte per value (20 bits).

Format v1 (after the common header of codec.py):

    varint k
    per tensor of 2+ dims, sorted by name: u8 theta | 4 x f32 centroids | 4 x varint bin counts
    dense value model (floatcode.write_models, one context: exponent 127)
    varint words | u32 words    positions stream
    varint words | u32 words    values stream: bins per sparse tensor, then dense values
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from protocol import floatcode, positions
from protocol.ans import AnsDecoder, AnsEncoder
from protocol.codec import Codec, CodecStats, State, check_gaps, f32_tensor, numel, read_words, write_words
from protocol.errors import MalformedPayload, NonFiniteValues
from protocol.wire import Reader, Writer

TILE = 64
CHUNK = TILE * TILE
BINS = 4
DENSE_CTX = 127  # exponent of 1.0: the context of every dense value
_BIN_EDGES = np.array([-1.5, 0.0, 1.5])  # in std units around the mean: 4 bins over 6 std


def is_dense(shape: torch.Size) -> bool:
    return len(shape) < 2


def chunk_order(shape: torch.Size) -> np.ndarray | None:
    """Flat index of each chunk-order index (64x64 tiles), or None when chunks are flat runs."""
    if len(shape) == 2 and shape[0] % TILE == 0 and shape[1] % TILE == 0:
        rows, cols = shape
        return np.arange(rows * cols).reshape(rows // TILE, TILE, cols // TILE, TILE).transpose(0, 2, 1, 3).reshape(-1)
    return None


def chunk_sizes(n: int) -> np.ndarray:
    """Sizes of the chunks of n elements: full 4096-element chunks, then the remainder."""
    sizes = [CHUNK] * (n // CHUNK) + ([n % CHUNK] if n % CHUNK else [])
    return np.array(sizes, dtype=np.int64)


def quantize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bin per value, 4 FP32 centroids) for values binned over mean +- 3 std."""
    v = values.astype(np.float64)
    mean, std = (float(v.mean()), float(v.std())) if v.size else (0.0, 0.0)
    bins = np.searchsorted(mean + std * _BIN_EDGES, v, side="right")
    counts = np.bincount(bins, minlength=BINS)
    sums = np.bincount(bins, weights=v, minlength=BINS)
    return bins, (sums / np.maximum(counts, 1)).astype(np.float32)


@dataclass
class _Sparse:
    sizes: np.ndarray  # per chunk
    k: np.ndarray  # picked per chunk
    theta: int  # geometric ratio byte for the tensor's gaps (0 if every chunk is fully picked)
    gaps: np.ndarray  # per picked position, chunk-major
    bins: np.ndarray
    centroids: np.ndarray  # (4,) float32


class SparseLoCoCodec(Codec):
    name = "sparseloco"
    magic = b"SLOC"
    version = 1

    def __init__(self, k: int = 64, beta: float = 0.95) -> None:
        if not 1 <= k <= CHUNK:
            raise ValueError(f"k must be in 1..{CHUNK}, got {k}")
        if not 0 <= beta <= 1:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.k, self.beta = k, beta

    def send_k(self, fraction: float) -> int:
        """Values per chunk for a payload of `fraction` of the usual size: at least 1, at most the run's k."""
        return max(1, min(self.k, int(self.k * fraction + 1e-9)))

    def _encode(
        self, w: Writer, delta: State, error: State, weights: State, fraction: float
    ) -> tuple[dict[str, torch.Tensor], CodecStats]:
        k_send = self.send_k(fraction)
        w.varint(k_send)
        new_error: dict[str, torch.Tensor] = {}
        sparse: list[_Sparse] = []
        dense: list[np.ndarray] = []
        for name in sorted(weights):
            acc = (error[name] * self.beta + delta[name]).reshape(-1)
            if is_dense(weights[name].shape):
                sent = acc.to(torch.bfloat16).float()  # acc - sent is exact (Sterbenz)
                dense.append(sent.numpy())
                new_error[name] = (acc - sent).reshape(weights[name].shape)
                continue
            part, e_new = self._sparsify(acc, weights[name].shape, k_send)
            new_error[name] = e_new.reshape(weights[name].shape)
            w.u8(part.theta)
            w.raw(part.centroids.astype("<f4").tobytes())
            for c in np.bincount(part.bins, minlength=BINS).tolist():
                w.varint(c)
            sparse.append(part)
        dense_values = np.concatenate(dense) if dense else np.zeros(0, dtype=np.float32)
        coded = floatcode.split(dense_values, np.full(len(dense_values), DENSE_CTX), floatcode.BF16_MANTISSA)
        start = len(w.getvalue())
        floatcode.write_models(w, coded.models)
        model_bytes = len(w.getvalue()) - start
        pos_enc, val_enc = AnsEncoder(), AnsEncoder()
        cat = lambda arrays: np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)  # noqa: E731
        positions.encode_gaps(
            pos_enc,
            cat([p.gaps for p in sparse]),
            cat([np.repeat(positions.golomb_m(p.sizes, p.k), p.k) for p in sparse]),
            cat([np.repeat(np.where(p.k < p.sizes, p.theta, 0), p.k) for p in sparse]),
        )
        for part in sparse:
            val_enc.categorical(part.bins, np.bincount(part.bins, minlength=BINS))
        floatcode.encode(val_enc, coded, floatcode.BF16_MANTISSA)
        pos_words, val_words = pos_enc.finish(), val_enc.finish()
        write_words(w, pos_words)
        write_words(w, val_words)
        n_sparse = sum(len(p.bins) for p in sparse)
        stats = CodecStats(
            elements=numel(weights),
            sent=n_sparse + len(dense_values),
            payload_bytes=0,
            position_bytes=4 * pos_words.size,
            value_bytes=4 * val_words.size + model_bytes,
        )
        return new_error, stats

    def _sparsify(self, acc: torch.Tensor, shape: torch.Size, k_send: int) -> tuple[_Sparse, torch.Tensor]:
        """Pick top-k_send per chunk of the flat `acc`; the part to send and the new flat buffer."""
        perm = chunk_order(shape)
        co = acc[torch.from_numpy(perm)] if perm is not None else acc  # chunk order
        sizes = chunk_sizes(acc.numel())
        k = np.minimum(k_send, sizes)
        picked = []
        n_full = int((sizes == CHUNK).sum())
        if n_full:
            top = co[: n_full * CHUNK].view(n_full, CHUNK).abs().topk(int(k[0]), dim=1).indices  # (chunks, k)
            picked.append((top.sort(dim=1).values + torch.arange(n_full)[:, None] * CHUNK).reshape(-1))
        if len(sizes) > n_full:
            tail = co[n_full * CHUNK :].abs().topk(int(k[-1])).indices.sort().values
            picked.append(tail + n_full * CHUNK)
        sidx = torch.cat(picked).numpy() if picked else np.zeros(0, dtype=np.int64)
        values = co.numpy()[sidx]
        bins, centroids = quantize(values)
        flat_idx = torch.from_numpy(perm[sidx] if perm is not None else sidx)
        e_new = acc.clone()
        e_new[flat_idx] = acc[flat_idx] - torch.from_numpy(centroids[bins])
        _, gaps = positions.split_gaps(sidx, np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes)
        coded = np.repeat(k < sizes, k)
        q = gaps // np.repeat(positions.golomb_m(sizes, k), k)
        theta = positions.fit_theta(q[coded]) if coded.any() else 0
        return _Sparse(sizes, k, theta, gaps, bins, centroids), e_new

    def _decode(self, r: Reader, weights: State) -> dict[str, torch.Tensor]:
        k = r.varint(CHUNK, "k")
        if not 1 <= k <= self.k:  # fewer is a miner with a slow uplink (`send_k`); more is not this run
            raise MalformedPayload(f"payload picks {k} per chunk, this run sends 1 to {self.k}")
        names = sorted(weights)
        headers = {
            name: self._read_header(r, name, weights[name].numel(), k)
            for name in names
            if not is_dense(weights[name].shape)
        }
        n_dense = sum(weights[name].numel() for name in names if name not in headers)
        dense_models = floatcode.read_models(r, n_dense)
        pos_words, val_words = read_words(r), read_words(r)
        r.expect_end()
        sidx = self._decode_positions(pos_words, weights, headers, k)
        dec = AnsDecoder(val_words)
        out: dict[str, torch.Tensor] = {}
        for name, (_, centroids, counts) in headers.items():
            bins = dec.categorical(int(counts.sum()), counts)
            if not np.array_equal(np.bincount(bins, minlength=BINS), counts):
                raise MalformedPayload(f"{name}: decoded bins disagree with their counts")
            flat = np.zeros(weights[name].numel(), dtype=np.float32)
            perm = chunk_order(weights[name].shape)
            flat[perm[sidx[name]] if perm is not None else sidx[name]] = centroids[bins]
            out[name] = f32_tensor(flat, weights[name], name)
        dense = floatcode.decode(
            dec, np.full(n_dense, DENSE_CTX, dtype=np.uint8), dense_models, floatcode.BF16_MANTISSA
        )
        dec.finish()
        offset = 0
        for name in names:
            if name not in headers:
                size = weights[name].numel()
                out[name] = f32_tensor(dense[offset : offset + size], weights[name], name)
                offset += size
        return {name: out[name] for name in names}

    def _read_header(self, r: Reader, name: str, n: int, k_sent: int) -> tuple[int, np.ndarray, np.ndarray]:
        theta = r.u8()
        centroids = np.frombuffer(r.raw(4 * BINS), dtype="<f4").astype(np.float32)
        if not np.isfinite(centroids).all():
            raise NonFiniteValues(f"{name}: NaN or inf centroid")
        counts = np.array([r.varint(n, f"{name} bin count") for _ in range(BINS)], dtype=np.int64)
        sizes = chunk_sizes(n)
        k = np.minimum(k_sent, sizes)
        if int(counts.sum()) != int(k.sum()):
            raise MalformedPayload(f"{name}: bin counts add up to {int(counts.sum())}, top-k sends {int(k.sum())}")
        if (theta == 0) != bool((k == sizes).all()):
            raise MalformedPayload(f"{name}: theta 0 must mean every chunk is fully sent")
        return theta, centroids, counts

    def _decode_positions(
        self, words: np.ndarray, weights: State, headers: dict[str, tuple[int, np.ndarray, np.ndarray]], k_sent: int
    ) -> dict[str, np.ndarray]:
        """Chunk-order picked indices per sparse tensor, ascending."""
        geometry = {}
        for name, (theta, _, _) in headers.items():
            sizes = chunk_sizes(weights[name].numel())
            k = np.minimum(k_sent, sizes)
            geometry[name] = (sizes, k, np.repeat(np.where(k < sizes, theta, 0), k))
        cat = lambda i: np.concatenate([g[i] for g in geometry.values()]) if geometry else np.zeros(0, dtype=np.int64)  # noqa: E731
        sizes_all, k_all, theta_all = cat(0), cat(1), cat(2)
        dec = AnsDecoder(words)
        gaps = positions.decode_gaps(dec, np.repeat(positions.golomb_m(sizes_all, k_all), k_all), theta_all)
        dec.finish()
        check_gaps(gaps, np.repeat(sizes_all, k_all))
        out, offset = {}, 0
        for name, (sizes, k, _) in geometry.items():
            total = int(k.sum())
            starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
            out[name] = positions.join_gaps(gaps[offset : offset + total], starts, sizes, k) if total else gaps[:0]
            offset += total
        return out
