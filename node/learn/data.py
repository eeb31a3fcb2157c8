"""Token corpora and seeded batches; the embedded corpus (the standard library's `.py` sources, as bytes).

    corpus = stdlib_corpus()                 # the embedded default: always present, no download
    x, y = corpus.batch(seed, 8, 64)         # (8, 64) int64 inputs and next-token targets
    corpus.digest()                          # SHA-256 of both splits' tokens: what every node must agree on

A corpus is two flat token arrays (train, held-out). They may be memory-mapped files (the token
cache of the user's own data, `tokencache.py`): a batch reads only the windows it draws, so nothing
here loads a whole corpus into RAM. Batches are drawn from a seed, so a batch is named by its seed:
miners derive theirs from (run id, round, public key) and the validator can redraw them.

The embedded corpus reads files in sorted path order up to a byte cap and puts each file on the
train or held-out side by a hash of its path (so the split never depends on the cap).
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

DEFAULT_CAP_BYTES = 16 * 2**20
HELD_OUT_PERCENT = 5
DIGEST_CHUNK = 1 << 22  # tokens hashed per step: the digest of a memory-mapped split never holds it whole
_SKIP_PARTS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class Corpus:
    """Tokens of the training and held-out splits: bytes (uint8), or a tokenizer's ids (int32/int64)."""

    train: torch.Tensor  # (N,) possibly backed by a memory-mapped file
    held_out: torch.Tensor  # (M,)

    def batch(
        self, seed: int, batch_size: int, seq_len: int, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (batch_size, seq_len) int64, drawn from `seed`."""
        if split not in ("train", "held_out"):
            raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
        data = self.train if split == "train" else self.held_out
        if len(data) <= seq_len + 1:
            raise ValueError(f"{split} split has {len(data)} tokens, too few for seq_len {seq_len}")
        gen = torch.Generator().manual_seed(seed % 2**63)
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
        offsets = starts[:, None] + torch.arange(seq_len + 1)[None, :]  # (B, T+1)
        window = data[offsets].long()
        return window[:, :-1], window[:, 1:]

    def digest(self) -> str:
        """SHA-256 (64 hex) of the token dtype and both splits: equal on two nodes iff they train on
        the same tokens. Streamed a chunk at a time."""
        h = hashlib.sha256(b"pulse/tokens/v1\x00")
        for split in (self.train, self.held_out):
            h.update(f"{split.dtype}:{len(split)}\x00".encode())
            for start in range(0, len(split), DIGEST_CHUNK):
                h.update(split[start : start + DIGEST_CHUNK].contiguous().numpy().data)
        return h.hexdigest()


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(key: bytes, percent: int = HELD_OUT_PERCENT) -> bool:
    """Whether a document (named by `key`: its path, or its own text) is held out: a hash decides,
    so the split is the same on every node and does not depend on order or caps."""
    return hashlib.sha256(key).digest()[0] * 100 < 256 * percent


def load_text_files(paths: list[Path], root: Path, cap_bytes: int, held_out_percent: int = HELD_OUT_PERCENT) -> Corpus:
    """Corpus from `paths` (read in the given order, whole files as bytes) until `cap_bytes` are taken."""
    train: list[bytes] = []
    held: list[bytes] = []
    total = 0
    for path in paths:
        if total >= cap_bytes:
            break
        try:
            text = path.read_bytes()[: cap_bytes - total]
        except OSError:
            continue  # unreadable file: the corpus is whatever can be read
        relpath = str(path.relative_to(root)).encode()
        (held if is_held_out(relpath, held_out_percent) else train).append(text)
        total += len(text)
    if not train or not held:
        raise ValueError(f"corpus under {root} is too small to split (read {total} bytes)")
    as_tensor = lambda parts: torch.from_numpy(np.frombuffer(b"".join(parts), dtype=np.uint8).copy())  # noqa: E731
    return Corpus(train=as_tensor(train), held_out=as_tensor(held))


def stdlib_corpus(cap_bytes: int = DEFAULT_CAP_BYTES, held_out_percent: int = HELD_OUT_PERCENT) -> Corpus:
    """The embedded default corpus."""
    root = stdlib_root()
    return load_text_files(stdlib_sources(root), root, cap_bytes, held_out_percent)


def stdlib_sources(root: Path) -> list[Path]:
    """The `.py` files under `root` outside `_SKIP_PARTS`, sorted by relative path. The skipped folders
    are not entered at all: a base interpreter's site-packages can hold ten times the standard
    library's files, and listing them cost every node process about half a second at start-up."""
    found: list[str] = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in _SKIP_PARTS]
        rel = os.path.relpath(folder, root)
        found += (name if rel == "." else os.path.join(rel, name) for name in files if name.endswith(".py"))
    return [root / rel for rel in sorted(found)]
