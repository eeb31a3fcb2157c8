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

Positions are gaps within each chunk (positions.py, one gap code per tensor) against the
log2 C(4096, 64) / 64 = 7.36-bit bound; bins are entropy-coded with their counts (~2 bits), all
with rANS (ans.py); Templar ships 12-bit indices plus a byte per value (20 bits).

Format v2 (after the common header of codec.py):

    varint k
    per tensor of 2+ dims, sorted by name: u8 gap code (0 = every chunk fully sent) |
        4 x f32 centroids | 4 x varint bin counts
    dense value model (floatcode.write_models, one context: exponent 127)
    varint words | u16 words    positions stream
    varint words | u16 words    values stream: bins of every sparse tensor, then dense values
Version 1 (constriction's coder) is refused as unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from protocol import floatcode, positions
from protocol.ans import AnsDecoder, AnsEncoder, Models, require
from protocol.codec import Codec, CodecStats, State, f32_tensor, numel, read_words, require_finite, write_words
from protocol.errors import InvalidPositions, MalformedPayload, NonFiniteValues
from protocol.wire import Reader, Writer

TILE = 64
CHUNK = TILE * TILE
BINS = 4
DENSE_CTX = 127  # exponent of 1.0: the context of every dense value
_BIN_EDGES = np.array([-1.5, 0.0, 1.5])  # in std units around the mean: 4 bins over 6 std


def is_dense(shape: torch.Size) -> bool:
    return len(shape) < 2


def is_tiled(shape: torch.Size) -> bool:
    return len(shape) == 2 and shape[0] % TILE == 0 and shape[1] % TILE == 0


def chunk_order(shape: torch.Size) -> np.ndarray | None:
    """Flat index of each chunk-order index (64x64 tiles), or None when chunks are flat runs.
    (A reference for tests; the codec maps only the picked indices, with `flat_index`.)"""
    if is_tiled(shape):
        rows, cols = shape
        return np.arange(rows * cols).reshape(rows // TILE, TILE, cols // TILE, TILE).transpose(0, 2, 1, 3).reshape(-1)
    return None


def in_chunk_order(t: torch.Tensor) -> torch.Tensor:
    """The flat tensor in chunk order: 64x64 tiles row-major (a copy), or itself as flat runs."""
    if is_tiled(t.shape):
        rows, cols = t.shape
        return t.reshape(rows // TILE, TILE, cols // TILE, TILE).permute(0, 2, 1, 3).reshape(-1)
    return t.reshape(-1)


def flat_index(shape: torch.Size, sidx: np.ndarray) -> np.ndarray:
    """Flat indices of chunk-order indices `sidx` (the inverse of `in_chunk_order`, pointwise)."""
    if not is_tiled(shape):
        return sidx
    cols = shape[1]
    tile, inner = sidx // CHUNK, sidx % CHUNK
    tile_row, tile_col = tile // (cols // TILE), tile % (cols // TILE)
    return (tile_row * TILE + inner // TILE) * cols + tile_col * TILE + inner % TILE


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
    code: int  # gap code byte for the tensor's gaps (FULL if every chunk is fully picked)
    gaps: np.ndarray  # per picked position, chunk-major
    bins: np.ndarray
    centroids: np.ndarray  # (4,) float32


class SparseLoCoCodec(Codec):
    name = "sparseloco"
    magic = b"SLOC"
    version = 2

    def __init__(self, k: int = 64, beta: float = 0.95) -> None:
        if not 1 <= k <= CHUNK:
            raise ValueError(f"k must be in 1..{CHUNK}, got {k}")
        if not 0 <= beta <= 1:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.k, self.beta = k, beta

    def _encode(
        self, w: Writer, delta: State, error: State, weights: State
    ) -> tuple[dict[str, torch.Tensor], CodecStats]:
        w.varint(self.k)
        new_error: dict[str, torch.Tensor] = {}
        sparse: list[_Sparse] = []
        dense: list[np.ndarray] = []
        for name in sorted(weights):
            acc = (error[name] * self.beta + delta[name]).reshape(-1)
            if is_dense(weights[name].shape):
                require_finite(name, acc)
                sent = acc.to(torch.bfloat16).float()  # acc - sent is exact (Sterbenz)
                dense.append(sent.cpu().numpy())
                new_error[name] = (acc - sent).reshape(weights[name].shape)
                continue
            part, e_new = self._sparsify(acc, weights[name].shape)
            new_error[name] = e_new.reshape(weights[name].shape)
            w.u8(part.code)
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
        positions.encode_gaps(pos_enc, cat([p.gaps for p in sparse]), cat([_gap_codes(p) for p in sparse]))
        if sparse:
            bins = Models.from_counts(np.stack([np.bincount(p.bins, minlength=BINS) for p in sparse]))
            val_enc.categorical(
                cat([p.bins for p in sparse]), bins, np.repeat(np.arange(len(sparse)), [len(p.bins) for p in sparse])
            )
        floatcode.encode(val_enc, coded, floatcode.BF16_MANTISSA)
        pos_words, val_words = pos_enc.finish(), val_enc.finish()
        write_words(w, pos_words)
        write_words(w, val_words)
        n_sparse = sum(len(p.bins) for p in sparse)
        stats = CodecStats(
            elements=numel(weights),
            sent=n_sparse + len(dense_values),
            payload_bytes=0,
            position_bytes=2 * pos_words.size,
            value_bytes=2 * val_words.size + model_bytes,
        )
        return new_error, stats

    def _sparsify(self, acc: torch.Tensor, shape: torch.Size) -> tuple[_Sparse, torch.Tensor]:
        """Pick top-k per chunk of the flat `acc`; the part to send and the new flat buffer."""
        co = in_chunk_order(acc.reshape(shape))
        magnitude = co.abs()
        require_finite(f"sparseloco tensor of shape {tuple(shape)}", co, magnitude)
        sizes = chunk_sizes(acc.numel())
        k = np.minimum(self.k, sizes)
        picked = []
        n_full = int((sizes == CHUNK).sum())
        if n_full:
            top = magnitude[: n_full * CHUNK].view(n_full, CHUNK).topk(int(k[0]), dim=1).indices  # (chunks, k)
            offsets = torch.arange(n_full, device=top.device)[:, None] * CHUNK
            picked.append((top.sort(dim=1).values + offsets).reshape(-1))
        if len(sizes) > n_full:
            tail = magnitude[n_full * CHUNK :].topk(int(k[-1])).indices.sort().values
            picked.append(tail + n_full * CHUNK)
        sidx_t = torch.cat(picked) if picked else torch.zeros(0, dtype=torch.int64)
        values = co[sidx_t].cpu().numpy()
        sidx = sidx_t.cpu().numpy()
        bins, centroids = quantize(values)
        flat_idx = torch.from_numpy(flat_index(shape, sidx)).to(acc.device)
        e_new = acc.clone()
        e_new[flat_idx] = acc[flat_idx] - torch.from_numpy(centroids[bins]).to(acc.device)
        _, gaps = positions.split_gaps(sidx, np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes)
        partial = np.repeat(k < sizes, k)
        code = 0
        if partial.any():
            one_class = np.zeros(int(partial.sum()), np.int64)
            codes, _ = positions.choose_codes(one_class, gaps[partial], np.array([CHUNK]), np.array([self.k]))
            code = int(codes[0])
        return _Sparse(sizes, k, code, gaps, bins, centroids), e_new

    def _decode(self, r: Reader, weights: State) -> dict[str, torch.Tensor]:
        k = r.varint(CHUNK, "k")
        if k != self.k:
            raise MalformedPayload(f"payload picks {k} per chunk, this run uses {self.k}")
        names = sorted(weights)
        headers = {
            name: self._read_header(r, name, weights[name].numel())
            for name in names
            if not is_dense(weights[name].shape)
        }
        n_dense = sum(weights[name].numel() for name in names if name not in headers)
        dense_models = floatcode.read_models(r, n_dense)
        pos_words, val_words = read_words(r), read_words(r)
        r.expect_end()
        picked = sum(int(c.sum()) for _, _, c in headers.values())
        require(val_words, picked + n_dense, n_dense * floatcode.BF16_MANTISSA, "values stream")
        sidx = self._decode_positions(pos_words, weights, headers)
        dec = AnsDecoder(val_words)
        out: dict[str, torch.Tensor] = {}
        if headers:
            counts = np.stack([c for _, _, c in headers.values()])
            ids = np.repeat(np.arange(len(headers)), counts.sum(axis=1))
            all_bins = dec.categorical(Models.from_counts(counts), ids)
        offset = 0
        for name, (_, centroids, c) in headers.items():
            bins = all_bins[offset : offset + int(c.sum())]
            offset += int(c.sum())
            if not np.array_equal(np.bincount(bins, minlength=BINS), c):
                raise MalformedPayload(f"{name}: decoded bins disagree with their counts")
            flat = np.zeros(weights[name].numel(), dtype=np.float32)
            flat[flat_index(weights[name].shape, sidx[name])] = centroids[bins]  # finite: checked in the header
            out[name] = torch.from_numpy(flat).reshape(weights[name].shape)
        dense = floatcode.decode(
            dec, np.full(n_dense, DENSE_CTX, dtype=np.uint8), dense_models, floatcode.BF16_MANTISSA
        )
        dec.finish()
        offset = 0
        for name in names:
            if name not in headers:
                size = weights[name].numel()
                out[name] = f32_tensor(dense[offset : offset + size], weights[name], name)  # a copy of a slice
                offset += size
        return {name: out[name] for name in names}

    def _read_header(self, r: Reader, name: str, n: int) -> tuple[int, np.ndarray, np.ndarray]:
        code = r.u8()
        if code > positions.MAX_CODE:
            raise MalformedPayload(f"{name}: unknown gap code {code}")
        centroids = np.frombuffer(r.raw(4 * BINS), dtype="<f4").astype(np.float32)
        if not np.isfinite(centroids).all():
            raise NonFiniteValues(f"{name}: NaN or inf centroid")
        counts = np.array([r.varint(n, f"{name} bin count") for _ in range(BINS)], dtype=np.int64)
        sizes = chunk_sizes(n)
        k = np.minimum(self.k, sizes)
        if int(counts.sum()) != int(k.sum()):
            raise MalformedPayload(f"{name}: bin counts add up to {int(counts.sum())}, top-k sends {int(k.sum())}")
        if (code == positions.FULL) != bool((k == sizes).all()):
            raise MalformedPayload(f"{name}: gap code 0 must mean every chunk is fully sent")
        return code, centroids, counts

    def _decode_positions(
        self, words: np.ndarray, weights: State, headers: dict[str, tuple[int, np.ndarray, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        """Chunk-order picked indices per sparse tensor, ascending."""
        geometry = {}
        for name, (code, _, _) in headers.items():
            sizes = chunk_sizes(weights[name].numel())
            k = np.minimum(self.k, sizes)
            geometry[name] = (sizes, k, np.repeat(np.where(k < sizes, code, positions.FULL), k))
        cat = lambda i: np.concatenate([g[i] for g in geometry.values()]) if geometry else np.zeros(0, dtype=np.int64)  # noqa: E731
        sizes_all, k_all, codes = cat(0), cat(1), cat(2)
        dec = AnsDecoder(words)
        gaps = positions.decode_gaps(dec, codes)
        dec.finish()
        positions.check_gaps(gaps, np.repeat(sizes_all, k_all))
        out, offset = {}, 0
        for name, (sizes, k, _) in geometry.items():
            total = int(k.sum())
            ranks = positions.ranks_from_gaps(gaps[offset : offset + total], k)
            if np.any(ranks >= np.repeat(sizes, k)):
                raise InvalidPositions(f"{name}: a picked position is past the end of its chunk")
            starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
            out[name] = ranks + np.repeat(starts, k)
            offset += total
        return out


def _gap_codes(part: _Sparse) -> np.ndarray:
    """The gap code of each picked position: the tensor's, or FULL in a fully sent chunk."""
    return np.repeat(np.where(part.k < part.sizes, part.code, positions.FULL), part.k)
