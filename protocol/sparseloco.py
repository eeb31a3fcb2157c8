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
from protocol.codec import (
    Codec,
    CodecStats,
    State,
    carried_sum,
    f32_tensor,
    f32_zeros,
    numel,
    read_words,
    require_finite,
    write_words,
)
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
    (A reference for tests; the codec permutes tensors with `in_chunk_order`.)"""
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

    def send_k(self, fraction: float) -> int:
        """Values per chunk for a payload of `fraction` of the usual size: at least 1, at most the run's k."""
        return max(1, min(self.k, int(self.k * fraction + 1e-9)))

    def _encode(
        self, w: Writer, delta: State, error: State, weights: State, fraction: float, error_dtype: torch.dtype
    ) -> tuple[dict[str, torch.Tensor], CodecStats]:
        k_send = self.send_k(fraction)
        w.varint(k_send)
        new_error: dict[str, torch.Tensor] = {}
        sparse: list[_Sparse] = []
        dense: list[np.ndarray] = []
        for name in sorted(weights):
            acc = carried_sum(error[name], delta[name], self.beta).reshape(-1)
            if is_dense(weights[name].shape):
                require_finite(name, acc)
                sent = acc.to(torch.bfloat16).float()  # acc - sent is exact (Sterbenz)
                dense.append(sent.cpu().numpy())
                new_error[name] = (acc - sent).reshape(weights[name].shape).to(error_dtype)
                continue
            part, e_new = self._sparsify(acc, weights[name].shape, k_send)
            new_error[name] = e_new.reshape(weights[name].shape).to(error_dtype)  # narrowed once done
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
        positions.encode_gaps(
            pos_enc, cat([p.gaps for p in sparse]), cat([p.k for p in sparse]), cat([_chunk_codes(p) for p in sparse])
        )
        if sparse:
            bins = Models.from_counts(np.stack([np.bincount(p.bins, minlength=BINS) for p in sparse]))
            lengths = np.array([len(p.bins) for p in sparse])
            val_enc.categorical(np.concatenate([p.bins for p in sparse]), bins, runs=(np.arange(len(sparse)), lengths))
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

    def _sparsify(self, acc: torch.Tensor, shape: torch.Size, k_send: int) -> tuple[_Sparse, torch.Tensor]:
        """Pick top-k_send per chunk of the flat `acc` (a buffer this codec owns); the part to send and
        the new buffer, which reuses acc's memory (the residual written back in tensor order)."""
        co = in_chunk_order(acc.reshape(shape))
        magnitude = co.abs()
        require_finite(f"sparseloco tensor of shape {tuple(shape)}", co, magnitude)
        sizes = chunk_sizes(acc.numel())
        k = np.minimum(k_send, sizes)
        n_full = int((sizes == CHUNK).sum())
        full = co[: n_full * CHUNK].view(n_full, CHUNK)
        top = magnitude[: n_full * CHUNK].view(n_full, CHUNK).topk(k_send, dim=1).indices.sort(dim=1).values
        tail = co[n_full * CHUNK :]
        tail_top = magnitude[n_full * CHUNK :].topk(int(k[-1]) if len(sizes) > n_full else 0).indices.sort().values
        del magnitude
        values = torch.cat([full.gather(1, top).reshape(-1), tail[tail_top]]).cpu().numpy()
        bins, centroids = quantize(values)
        sent = torch.from_numpy(centroids[bins]).to(co.device)
        full.scatter_add_(1, top, -sent[: top.numel()].view_as(top))  # co is ours: the residual in place
        tail[tail_top] -= sent[top.numel() :]
        gaps = chunk_gaps(top, tail_top)
        _back_to_tensor_order(co, acc, shape)
        code = positions.FULL
        if k_send < CHUNK or (len(sizes) > n_full and k[-1] < sizes[-1]):
            partial = np.repeat(k < sizes, k)
            one_class = np.zeros(int(partial.sum()), np.int64)
            codes, _ = positions.choose_codes(one_class, gaps[partial], np.array([CHUNK]), np.array([k_send]))
            code = int(codes[0])
        return _Sparse(sizes, k, code, gaps, bins.astype(np.uint8), centroids), acc

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
        picked = sum(int(c.sum()) for _, _, c in headers.values())
        require(val_words, picked + n_dense, n_dense * floatcode.BF16_MANTISSA, "values stream")
        gaps = self._decode_gaps(pos_words, weights, headers, k)
        dec = AnsDecoder(val_words)
        out: dict[str, torch.Tensor] = {}
        if headers:
            counts = np.stack([c for _, _, c in headers.values()])
            all_bins = dec.categorical(Models.from_counts(counts), runs=(np.arange(len(headers)), counts.sum(axis=1)))
        offset = 0
        for name, (_, centroids, c) in headers.items():
            total = int(c.sum())
            bins, tensor_gaps = all_bins[offset : offset + total], gaps[offset : offset + total]
            offset += total
            if not np.array_equal(np.bincount(bins, minlength=BINS), c):
                raise MalformedPayload(f"{name}: decoded bins disagree with their counts")
            shape, device = weights[name].shape, weights[name].device
            cols = shape[1] if is_tiled(shape) else 0
            index = picked_positions(
                torch.from_numpy(tensor_gaps.astype(np.int64)).to(device), k, weights[name].numel(), cols
            )
            if index is None:
                raise InvalidPositions(f"{name}: a picked position is past the end of its chunk")
            flat = f32_zeros(weights[name].numel(), device)
            sent = torch.from_numpy(centroids).to(device)[torch.from_numpy(bins.astype(np.int64)).to(device)]
            flat[index] = sent  # finite: centroids are checked in the header
            out[name] = flat.reshape(shape)
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

    def _read_header(self, r: Reader, name: str, n: int, k_sent: int) -> tuple[int, np.ndarray, np.ndarray]:
        code = r.u8()
        if code > positions.MAX_CODE:
            raise MalformedPayload(f"{name}: unknown gap code {code}")
        centroids = np.frombuffer(r.raw(4 * BINS), dtype="<f4").astype(np.float32)
        if not np.isfinite(centroids).all():
            raise NonFiniteValues(f"{name}: NaN or inf centroid")
        counts = np.array([r.varint(n, f"{name} bin count") for _ in range(BINS)], dtype=np.int64)
        sizes = chunk_sizes(n)
        k = np.minimum(k_sent, sizes)
        if int(counts.sum()) != int(k.sum()):
            raise MalformedPayload(f"{name}: bin counts add up to {int(counts.sum())}, top-k sends {int(k.sum())}")
        if (code == positions.FULL) != bool((k == sizes).all()):
            raise MalformedPayload(f"{name}: gap code 0 must mean every chunk is fully sent")
        return code, centroids, counts

    def _decode_gaps(
        self, words: np.ndarray, weights: State, headers: dict[str, tuple[int, np.ndarray, np.ndarray]], k_sent: int
    ) -> np.ndarray:
        """The gaps of every sparse tensor's picks, chunk by chunk, tensors in order."""
        ks, codes = [], []
        for name, (code, _, _) in headers.items():
            sizes = chunk_sizes(weights[name].numel())
            k = np.minimum(k_sent, sizes)
            ks.append(k)
            codes.append(np.where(k < sizes, code, positions.FULL))
        cat = lambda arrays: np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)  # noqa: E731
        dec = AnsDecoder(words)
        gaps = positions.decode_gaps(dec, cat(ks), cat(codes))
        dec.finish()
        return gaps


def chunk_gaps(top: torch.Tensor, tail_top: torch.Tensor) -> np.ndarray:
    """Gaps between the sorted picks of each chunk (the first from -1): (chunks, k) and the tail."""
    gaps = [
        torch.diff(top, dim=1, prepend=top.new_full((top.shape[0], 1), -1)).reshape(-1) - 1,
        torch.diff(tail_top, prepend=tail_top.new_full((1,), -1)) - 1,
    ]
    return torch.cat(gaps).to(torch.int32).cpu().numpy()


def _back_to_tensor_order(co: torch.Tensor, acc: torch.Tensor, shape: torch.Size) -> None:
    """Write the chunk-ordered `co` into `acc` in the tensor's own order (nothing to do for runs)."""
    if is_tiled(shape) and co.data_ptr() != acc.data_ptr():  # one tile column: chunk order is the order
        rows, cols = shape
        acc.view(rows // TILE, TILE, cols // TILE, TILE).copy_(
            co.view(rows // TILE, cols // TILE, TILE, TILE).transpose(1, 2)
        )


def picked_positions(gaps: torch.Tensor, k: int, n: int, cols: int) -> torch.Tensor | None:
    """Flat index of every pick (tensor ops where `gaps` is): picks are gaps inside chunks of
    CHUNK (k a chunk; the last chunk smaller, fully sent when it has at most k weights), 64x64
    tiles when cols > 0. None if a pick falls past its chunk or the gaps do not fill the chunks."""
    n_full, tail = n // CHUNK, n % CHUNK
    k_tail = min(k, tail)
    if gaps.numel() != n_full * k + k_tail:
        return None
    # gaps are >= 0 as decoded, so ranks rise within a chunk
    if gaps.numel() and int(gaps.max()) >= CHUNK:  # no chunk is that large; keeps the sums from overflowing
        return None
    sums = torch.cumsum(gaps + 1, dim=0)  # one flat scan; each chunk's ranks are its part minus the part before
    ends = sums[: n_full * k].view(n_full, k)[:, -1]
    before = torch.cat([sums.new_zeros(1), ends])
    full = sums[: n_full * k].view(n_full, k) - before[:-1].unsqueeze(1) - 1  # (chunks, k) ranks
    last = sums[n_full * k :] - before[-1] - 1
    if (n_full and bool((full[:, -1] >= CHUNK).any())) or (k_tail and int(last[-1]) >= tail):
        return None
    starts = torch.arange(n_full, device=gaps.device).unsqueeze(1) * CHUNK
    sidx = torch.cat([(full + starts).reshape(-1), last + n_full * CHUNK])
    if not cols:
        return sidx
    tile, inner = sidx // CHUNK, sidx % CHUNK
    per_row = cols // TILE
    return ((tile // per_row) * TILE + inner // TILE) * cols + (tile % per_row) * TILE + inner % TILE


def _chunk_codes(part: _Sparse) -> np.ndarray:
    """The gap code of each chunk: the tensor's, or FULL for a fully sent one."""
    return np.where(part.k < part.sizes, part.code, positions.FULL)
