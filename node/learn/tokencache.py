"""The token cache: the user's documents tokenized once, on disk, memory-mapped by every role.

    spec = CacheSpec(files=resolve(paths), field="text", held_out_percent=5, cap_bytes=2**30)
    corpus = open_or_build(spec, tokenizer, root=default_cache_dir() / "tokens")
    corpus.train            # (N,) int32 token ids (uint8 bytes without a tokenizer), memory-mapped

Layout: `<root>/<key>/{train.bin, held_out.bin, meta.json}`, written under a temporary name and
renamed into place, so a killed build leaves nothing that looks finished. The key hashes what the
tokens depend on: each file's path, size and modification time, the field, the split, the cap and
the tokenizer's files. `meta.json` holds the token counts and the digest (`Corpus.digest`), which
is checked again on every open: a damaged cache is rebuilt, never trained on.

The split: each document goes to held-out when a hash of its text says so (`data.is_held_out`),
so it is the same on every node, with any number of files. Documents are separated by the
tokenizer's end-of-text token where it has one (JSONL and Parquet records are separate documents);
a text file's paragraphs are joined by a blank line, as they were written. Without a tokenizer the
tokens are the UTF-8 bytes. RAM holds one batch of documents at a time, never the corpus.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from node.learn.data import HELD_OUT_PERCENT, Corpus, is_held_out
from node.learn.datafiles import DataFile, Format, check, documents

log = logging.getLogger(__name__)
VERSION = 1
SPLITS = ("train", "held_out")


@dataclass(frozen=True)
class CacheSpec:
    files: list[DataFile]
    field: str = "text"
    held_out_percent: int = HELD_OUT_PERCENT
    cap_bytes: int = 2**62  # bytes of document text read at most


@dataclass(frozen=True)
class Tokens:
    """A tokenizer as the cache sees it: a function of a batch of texts, its dtype and its identity."""

    encode: Any  # list[str] -> list[list[int]]
    dtype: np.dtype[Any]
    identity: str  # hashes into the cache key
    eos: int | None

    @classmethod
    def of(cls, tokenizer: Any, files: list[Path]) -> Tokens:
        """A Hugging Face tokenizer (from `files`, which name it in the key)."""
        h = hashlib.sha256()
        for path in sorted(files):
            h.update(path.name.encode() + b"\x00" + path.read_bytes())

        def encode(texts: list[str]) -> list[list[int]]:
            ids: list[list[int]] = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            return ids

        eos = tokenizer.eos_token_id
        return cls(encode, np.dtype(np.int32), h.hexdigest(), eos if isinstance(eos, int) else None)

    @classmethod
    def bytes(cls) -> Tokens:
        def encode(texts: list[str]) -> list[np.ndarray[Any, Any]]:
            return [np.frombuffer(t.encode(), dtype=np.uint8) for t in texts]  # no Python int per byte

        return cls(encode, np.dtype(np.uint8), "bytes", None)


def cache_key(spec: CacheSpec, tokens: Tokens) -> str:
    files = []
    for f in spec.files:
        st = f.path.stat()
        files.append([str(f.path.resolve()), f.format, st.st_size, st.st_mtime_ns])
    recipe = {
        "version": VERSION,
        "files": files,
        "field": spec.field,
        "held_out_percent": spec.held_out_percent,
        "cap_bytes": spec.cap_bytes,
        "tokenizer": tokens.identity,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:32]


def open_or_build(spec: CacheSpec, tokens: Tokens, root: Path) -> Corpus:
    """The cached corpus of `spec` (built now if missing or damaged)."""
    folder = root / cache_key(spec, tokens)
    corpus = _open(folder)
    if corpus is not None:
        log.info("token cache %s: %d train and %d held-out tokens", folder, len(corpus.train), len(corpus.held_out))
        return corpus
    check(spec.files, spec.field)
    log.info("tokenizing %d data files into %s (once)", len(spec.files), folder)
    _build(spec, tokens, folder)
    built = _open(folder)
    if built is None:
        raise RuntimeError(f"the token cache just written at {folder} does not read back")
    return built


def _open(folder: Path) -> Corpus | None:
    try:
        meta = json.loads((folder / "meta.json").read_text())
        dtype = np.dtype(meta["dtype"])
        splits = [_map(folder / f"{name}.bin", dtype, int(meta[name])) for name in SPLITS]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    corpus = Corpus(train=splits[0], held_out=splits[1])
    if corpus.digest() != meta.get("digest"):
        log.warning("token cache %s does not match its digest: rebuilding it", folder)
        return None
    return corpus


def _map(path: Path, dtype: np.dtype[Any], count: int) -> torch.Tensor:
    if path.stat().st_size != count * dtype.itemsize:
        raise ValueError(f"{path}: size does not match its token count")
    if count == 0:
        return torch.from_numpy(np.zeros(0, dtype=dtype))
    # copy-on-write: a writable view for torch that never writes to the file; pages load as read
    return torch.from_numpy(np.memmap(path, dtype=dtype, mode="c", shape=(count,)))


def _build(spec: CacheSpec, tokens: Tokens, folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        counts = _write(spec, tokens, work)
        corpus = Corpus(*(_map(work / f"{name}.bin", tokens.dtype, counts[name]) for name in SPLITS))
        meta = {"dtype": tokens.dtype.str, **counts, "digest": corpus.digest(), "files": len(spec.files)}
        (work / "meta.json").write_text(json.dumps(meta, sort_keys=True))
        del corpus
        if folder.exists() and _open(folder) is None:  # a damaged one; a whole one another process put
            shutil.rmtree(folder, ignore_errors=True)  # there meanwhile stays (others may be reading it)
        with contextlib.suppress(OSError):  # another process of this machine put the same tokens there first
            os.replace(work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write(spec: CacheSpec, tokens: Tokens, work: Path) -> dict[str, int]:
    """Tokenize the documents into `work/{train,held_out}.bin`; the token counts and documents read."""
    counts = dict.fromkeys(SPLITS, 0)
    taken = documents_read = 0
    with (work / "train.bin").open("wb") as train, (work / "held_out.bin").open("wb") as held:
        out = {"train": train, "held_out": held}
        for fmt, docs in documents(spec.files, spec.field, work / "arrow"):
            docs = _within_cap(docs, spec.cap_bytes - taken)
            taken += sum(len(d.encode()) for d in docs)
            documents_read += len(docs)
            for doc, ids in zip(docs, tokens.encode(_joinable(docs, fmt)), strict=True):
                name = "held_out" if is_held_out(doc.encode(), spec.held_out_percent) else "train"
                counts[name] += _append(out[name], ids, fmt, tokens)
            if taken >= spec.cap_bytes:
                break
    shutil.rmtree(work / "arrow", ignore_errors=True)
    counts["documents"] = documents_read
    return counts


def _within_cap(docs: list[str], room: int) -> list[str]:
    out = []
    for doc in docs:
        if room <= 0:
            break
        out.append(doc)
        room -= len(doc.encode())
    return out


def _joinable(docs: list[str], fmt: Format) -> list[str]:
    # a text file's paragraphs continue one another: a blank line after each, as in the file
    return [d + "\n\n" for d in docs] if fmt == "text" else docs


def _append(out: BinaryIO, ids: Any, fmt: Format, tokens: Tokens) -> int:
    """Write one document's ids (a list or an array), then the separator of JSONL/Parquet records."""
    doc_ids = np.asarray(ids, dtype=tokens.dtype)
    out.write(doc_ids.tobytes())
    if fmt == "text":
        return len(doc_ids)
    separator = np.asarray([tokens.eos] if tokens.eos is not None else list(b"\n\n"), dtype=tokens.dtype)
    out.write(separator.tobytes())
    return len(doc_ids) + len(separator)
