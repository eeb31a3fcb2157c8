"""The piece index of a checkpoint: which bytes of the blob are which state chunk, and their digests.

A checkpoint blob is a safetensors file: a header (JSON layout), then each tensor's raw
little-endian bytes. The state hash (`statehash.py`) already commits to a SHA-256 digest of every
`CHUNK_BYTES` chunk of every tensor, so those chunks are the pieces a joiner fetches from many
holders at once and checks one by one; the index adds where each tensor's bytes start in the blob
and the digest of the header piece.

    index = checkpoint_index(blob)                 # the validator, from the blob it announces
    data = index.to_bytes()                        # stored as a blob; its SHA-256 is announced
    index = PieceIndex.from_bytes(data, size=announced_blob_size)   # a joiner: bounded parse
    index.check_root(announced_state_hash)         # the chunk digests are the announced state's
    index.pieces()                                 # (offset, length, digest) tiling the blob
    index.check(piece_offset, piece_length, data)  # one piece

Format (integers are LEB128 varints):

    b"PCKP" | u8 version (1) | blob size | header length | 32-byte header digest | tensor count |
    per tensor, in sorted-name order: name (length-prefixed UTF-8) | dtype (length-prefixed ASCII) |
        ndim | dims | data offset in the blob | chunk count | chunk digests (32 bytes each)

Invariants checked on parse: names strictly increasing, known dtypes, chunk counts that match each
tensor's size, pieces (header, then every tensor's chunks in offset order) that tile the blob
exactly. Digests use the state hash's chunk domain, so the header digest can never pass as a chunk.

Trust: the index's own SHA-256 is in the validator's signed checkpoint announcement, so every digest
in it is the validator's word, and `check_root` ties the index to the announced state itself (the
state hash is a root over exactly these chunk digests).
"""

from __future__ import annotations

import itertools
import json
import struct
from dataclasses import dataclass

from protocol.errors import MalformedPayload, SizeLimitExceeded, StateHashMismatch
from protocol.statehash import CHUNK_BYTES, StateDigests, TensorDigests, chunk_digest
from protocol.wire import Reader, Writer

MAGIC = b"PCKP"
VERSION = 1
DIGEST = 32
MAX_TENSORS = 1 << 16
MAX_NAME = 1024
MAX_NDIM = 8
MAX_HEADER = 100 << 20  # safetensors' own cap on its header
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
_SAFETENSORS_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


@dataclass(frozen=True)
class IndexedTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # where its bytes start in the blob
    chunks: tuple[bytes, ...]

    @property
    def nbytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class PieceIndex:
    blob_size: int
    header_length: int
    header_digest: bytes
    tensors: tuple[IndexedTensor, ...]

    def pieces(self) -> list[tuple[int, int, bytes]]:
        """(offset, length, digest) of every piece, in blob order: the header, then each chunk."""
        out = [(0, self.header_length, self.header_digest)]
        for t in sorted(self.tensors, key=lambda t: t.offset):
            out += [
                (t.offset + i * CHUNK_BYTES, min(CHUNK_BYTES, t.nbytes - i * CHUNK_BYTES), d)
                for i, d in enumerate(t.chunks)
            ]
        return [p for p in out if p[1] > 0]

    def check_root(self, state_hash: str) -> None:
        """Raise `StateHashMismatch` unless the chunk digests commit to `state_hash` (the state hash
        is a root over exactly these digests, `statehash.py`)."""
        root = StateDigests(tuple(TensorDigests(t.name, t.dtype, t.shape, t.chunks) for t in self.tensors)).root()
        if root != state_hash:
            raise StateHashMismatch(f"piece index commits to {root[:12]}..., the checkpoint names {state_hash[:12]}...")

    @staticmethod
    def check(digest: bytes, data: bytes | memoryview) -> bool:
        """Whether `data` is the piece whose digest is `digest`."""
        return chunk_digest(data) == digest

    def to_bytes(self) -> bytes:
        w = Writer()
        w.raw(MAGIC)
        w.u8(VERSION)
        for value in (self.blob_size, self.header_length):
            w.varint(value)
        w.raw(self.header_digest)
        w.varint(len(self.tensors))
        for t in self.tensors:
            w.blob(t.name.encode())
            w.blob(t.dtype.encode())
            w.varint(len(t.shape))
            for d in t.shape:
                w.varint(d)
            w.varint(t.offset)
            w.varint(len(t.chunks))
            w.raw(b"".join(t.chunks))
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, *, size: int) -> PieceIndex:
        """Parse an index for a blob announced as `size` bytes; `MalformedPayload` on anything off."""
        r = Reader(data, "piece index")
        if bytes(r.raw(len(MAGIC))) != MAGIC or r.u8() != VERSION:
            raise MalformedPayload("not a version-1 piece index")
        blob_size = r.varint(size, "blob size")
        if blob_size != size:
            raise MalformedPayload(f"piece index is for a {blob_size}-byte blob, the checkpoint has {size}")
        header_length = r.varint(min(size, MAX_HEADER), "header length")
        header_digest = bytes(r.raw(DIGEST))
        count = r.varint(MAX_TENSORS, "tensor count")
        tensors = tuple(_read_tensor(r, size) for _ in range(count))
        r.expect_end()
        names = [t.name for t in tensors]
        if any(a >= b for a, b in itertools.pairwise(names)):
            raise MalformedPayload("piece index tensors are not in strictly increasing name order")
        index = cls(blob_size, header_length, header_digest, tensors)
        _check_tiling(index)
        return index


def _read_tensor(r: Reader, size: int) -> IndexedTensor:
    try:
        name = bytes(r.blob(MAX_NAME, "tensor name")).decode()
        dtype = bytes(r.blob(16, "dtype")).decode("ascii")
    except UnicodeDecodeError as exc:
        raise MalformedPayload(f"piece index: a name is not text: {exc}") from exc
    if dtype not in ITEMSIZE:
        raise MalformedPayload(f"piece index: unknown dtype {dtype!r:.20}")
    shape = tuple(r.varint(size, "dimension") for _ in range(r.varint(MAX_NDIM, "ndim")))
    offset = r.varint(size, "data offset")
    tensor = IndexedTensor(name, dtype, shape, offset, ())
    if tensor.nbytes > size:
        raise SizeLimitExceeded(f"piece index: tensor {name!r:.40} is larger than the blob")
    expected = -(-tensor.nbytes // CHUNK_BYTES)
    chunks = r.varint(size // CHUNK_BYTES + 1, "chunk count")
    if chunks != expected:
        raise MalformedPayload(f"piece index: {name!r:.40} has {chunks} chunks, its size needs {expected}")
    raw = bytes(r.raw(DIGEST * chunks))
    return IndexedTensor(name, dtype, shape, offset, tuple(raw[i : i + DIGEST] for i in range(0, len(raw), DIGEST)))


def _check_tiling(index: PieceIndex) -> None:
    end = 0
    for offset, length, _ in index.pieces():
        if offset != end:
            raise MalformedPayload(f"piece index: a piece starts at {offset}, the previous one ended at {end}")
        end += length
    if end != index.blob_size:
        raise MalformedPayload(f"piece index covers {end} bytes of a {index.blob_size}-byte blob")


def checkpoint_index(blob: bytes | memoryview) -> PieceIndex:
    """The index of a safetensors checkpoint made by this node (`roles/chainstate.checkpoint_bytes`)."""
    view = memoryview(blob)
    (header_len,) = struct.unpack("<Q", view[:8])
    header = json.loads(bytes(view[8 : 8 + header_len]))
    base = 8 + header_len
    tensors = []
    for name in sorted(k for k in header if k != "__metadata__"):
        entry = header[name]
        start, end = entry["data_offsets"]
        chunks = tuple(
            chunk_digest(view[base + o : base + min(o + CHUNK_BYTES, end)]) for o in range(start, end, CHUNK_BYTES)
        )
        tensors.append(
            IndexedTensor(name, _SAFETENSORS_DTYPE[entry["dtype"]], tuple(entry["shape"]), base + start, chunks)
        )
    return PieceIndex(len(view), base, chunk_digest(view[:base]), tuple(tensors))
