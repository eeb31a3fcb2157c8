"""The embedded corpus: the Python standard library's own `.py` sources, as bytes.

Always present, real text, no download. Files are read in sorted path order up to a byte
cap, split into train and held-out sets by a hash of the path (so the split never depends on
the cap), and concatenated. Batches are drawn from a seed, so a batch is named by its seed:
miners derive theirs from (run id, round, public key) and the validator can redraw them.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

DEFAULT_CAP_BYTES = 16 * 2**20
HELD_OUT_PERCENT = 5
_SKIP_PARTS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class Corpus:
    """Tokens of the training and held-out splits: bytes, or a tokenizer's ids (`node/learn/hfmodel.py`)."""

    train: torch.Tensor  # (N,) uint8 bytes or int64 token ids
    held_out: torch.Tensor  # (M,)

    def batch(
        self, seed: int, batch_size: int, seq_len: int, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-byte targets, each (batch_size, seq_len) int64, drawn from `seed`."""
        if split not in ("train", "held_out"):
            raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
        data = self.train if split == "train" else self.held_out
        if len(data) <= seq_len + 1:
            raise ValueError(f"{split} split has {len(data)} bytes, too few for seq_len {seq_len}")
        gen = torch.Generator().manual_seed(seed % 2**63)
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
        offsets = starts[:, None] + torch.arange(seq_len + 1)[None, :]  # (B, T+1)
        window = data[offsets].long()
        return window[:, :-1], window[:, 1:]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_held_out(relpath: str) -> bool:
    return hashlib.sha256(relpath.encode()).digest()[0] * 100 < 256 * HELD_OUT_PERCENT


def load_text_files(paths: list[Path], root: Path, cap_bytes: int) -> Corpus:
    """Corpus from `paths` (read in the given order) until `cap_bytes` are taken in total."""
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
        (held if _is_held_out(str(path.relative_to(root))) else train).append(text)
        total += len(text)
    if not train or not held:
        raise ValueError(f"corpus under {root} is too small to split (read {total} bytes)")
    as_tensor = lambda parts: torch.from_numpy(np.frombuffer(b"".join(parts), dtype=np.uint8).copy())  # noqa: E731
    return Corpus(train=as_tensor(train), held_out=as_tensor(held))


def stdlib_corpus(cap_bytes: int = DEFAULT_CAP_BYTES) -> Corpus:
    """The embedded default corpus."""
    root = stdlib_root()
    paths = sorted(
        (p for p in root.rglob("*.py") if not _SKIP_PARTS.intersection(p.relative_to(root).parts)),
        key=lambda p: str(p.relative_to(root)),
    )
    return load_text_files(paths, root, cap_bytes)
