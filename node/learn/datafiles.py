"""The user's own data files as documents: plain text, JSONL (a named field) and Parquet.

    files = resolve(["~/data", "~/more/*.parquet"])         # files, folders and globs -> DataFile list
    check(files, field="text")                               # one clear line per bad file, before any work
    for docs in documents(files, "text", scratch):           # batches of document strings, in file order
        ...

Reading goes through Hugging Face `datasets` (the library these users already keep their data
for), strictly offline: its packaged `text`, `json` and `parquet` builders turn the files into
Arrow tables in `scratch`, memory-mapped, and the documents are iterated a batch at a time, so a
corpus far larger than RAM streams through. A JSONL line or a Parquet row is a document (its
`field`); a text file's documents are its paragraphs (blank-line separated), so one file splits
into train and held-out by document.

Bad data fails before any work, with one line naming the file and what to do (`check`): a folder
or glob with no data files, a file that is not UTF-8, a JSONL file whose first record has no
`field`, a Parquet file without a string column `field`.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from protocol.errors import ConfigError

Format = Literal["text", "jsonl", "parquet"]
_BY_SUFFIX: dict[str, Format] = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_BUILDER: dict[Format, str] = {"text": "text", "jsonl": "json", "parquet": "parquet"}
READ_BATCH = 1024  # documents handed to the tokenizer at a time
_UTF8_BLOCK = 1 << 20


@dataclass(frozen=True)
class DataFile:
    path: Path
    format: Format


def resolve(paths: list[str], fmt: Format | Literal["auto"] = "auto") -> list[DataFile]:
    """Each entry a file, a folder (its files, recursively, sorted; hidden ones skipped) or a glob
    (sorted matches), in the given order; duplicates once. The format from the suffix unless `fmt`."""
    out: dict[Path, DataFile] = {}
    for entry in paths:
        for path in _expand(entry):
            out.setdefault(path, DataFile(path, fmt if fmt != "auto" else _BY_SUFFIX.get(path.suffix.lower(), "text")))
    return list(out.values())


def _expand(entry: str) -> list[Path]:
    path = Path(entry).expanduser()
    if glob.has_magic(str(path)):
        found = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not found:
            raise ConfigError(
                f"data.paths: {entry}: the pattern matches no file; check the path, or point it at a folder"
            )
        return found
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))
        if not found:
            raise ConfigError(f"data.paths: {path} is an empty folder: put .txt, .jsonl or .parquet files in it")
        return found
    if not path.is_file():
        raise ConfigError(f"data.paths: {path} does not exist: give a file, a folder or a glob")
    return [path]


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def check(files: list[DataFile], field: str) -> None:
    """`ConfigError` naming the first bad file and what to do; reads metadata and text encodings only."""
    for f in files:
        if f.format == "parquet":
            _check_parquet(f.path, field)
        else:
            _check_utf8(f.path)
            if f.format == "jsonl":
                _check_jsonl(f.path, field)


def _check_utf8(path: Path) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        with path.open("rb") as fh:
            while block := fh.read(_UTF8_BLOCK):
                decoder.decode(block)
                offset += len(block)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"data.paths: {path} is not UTF-8 text (bad byte near offset {offset + exc.start}): convert it, "
            f"e.g. `iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}`, or remove it"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"data.paths: {path} cannot be read: {exc}") from exc


def _check_jsonl(path: Path, field: str) -> None:
    with path.open(encoding="utf-8") as fh:
        first = next((line for line in fh if line.strip()), None)
    if first is None:
        raise ConfigError(f"data.paths: {path} has no records: remove it or fill it")
    try:
        record = json.loads(first)
    except ValueError as exc:
        raise ConfigError(f"data.paths: {path} is not JSON Lines (one JSON object per line): {exc}") from exc
    if not isinstance(record, dict) or not isinstance(record.get(field), str):
        keys = sorted(record) if isinstance(record, dict) else []
        raise ConfigError(
            f"data.paths: {path}: its records have no text field {field!r} (fields: {', '.join(keys) or 'none'}): "
            "set data.field to the one that holds the text"
        )


def _check_parquet(path: Path, field: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"data.paths: {path} is not a readable Parquet file: {exc}") from exc
    if field not in schema.names:
        raise ConfigError(
            f"data.paths: {path} has no column {field!r} (columns: {', '.join(schema.names)}): "
            "set data.field to the column that holds the text"
        )
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(f"data.paths: {path}: column {field!r} is {kind}, not text: set data.field to a text column")


def documents(files: list[DataFile], field: str, scratch: Path) -> Iterator[tuple[Format, list[str]]]:
    """Batches of documents (non-empty strings) in file order, each with its files' format; the Arrow
    tables `datasets` builds go to `scratch` (the caller deletes it). Consecutive text files are read
    as one dataset; each JSONL or Parquet file as its own, since shards of one corpus often differ in
    their other fields, which one dataset could not hold."""
    groups: list[tuple[Format, list[str]]] = []
    for f in files:
        if groups and groups[-1][0] == f.format == "text":
            groups[-1][1].append(str(f.path))
        else:
            groups.append((f.format, [str(f.path)]))
    for fmt, paths in groups:
        column = "text" if fmt == "text" else field
        for batch in _load(fmt, paths, field, scratch).iter(batch_size=READ_BATCH):
            docs = [d.strip() for d in batch[column] if isinstance(d, str)]
            yield fmt, [d for d in docs if d]


def _load(fmt: Format, paths: list[str], field: str, scratch: Path) -> Any:  # a `datasets.Dataset`
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never a network call
    import datasets

    datasets.disable_progress_bars()
    options: dict[str, object] = {"sample_by": "paragraph"} if fmt == "text" else {}
    if fmt == "parquet":
        options["columns"] = [field]
    try:
        return datasets.load_dataset(_BUILDER[fmt], data_files=paths, split="train", cache_dir=str(scratch), **options)
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as exc:
        where = paths[0] if len(paths) == 1 else f"{paths[0]} (and {len(paths) - 1} more {fmt} files)"
        raise ConfigError(f"data.paths: {where} could not be read as {fmt}: {exc.__cause__ or exc}") from exc
