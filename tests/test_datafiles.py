"""The user's own data: text, JSONL and Parquet through the token cache; bad data gets one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from node.learn.data import stdlib_corpus, stdlib_sources
from node.learn.datafiles import resolve
from node.learn.tokencache import CacheSpec, Tokens, open_or_build
from node.run.manifest import Manifest, load_manifest, parse_manifest
from node.run.presets import preset
from node.run.setup import RunSetup
from protocol.errors import ConfigError

pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PULSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "cache"


def _docs(n: int = 400) -> list[str]:
    return [f"document {i}: the quick brown fox {i * 7 % 13} jumps over {i} lazy dogs." for i in range(n)]


def _jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def _parquet(path: Path, docs: list[str], field: str = "text") -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({field: docs, "n": list(range(len(docs)))}), path)
    return path


def _manifest(paths: list[str], **data: object) -> Manifest:
    section = {"kind": "files", "paths": paths, "batch_size": 2, "seq_len": 16, **data}
    return parse_manifest({"name": "files", "model": {"gpt": {"block_size": 16}}, "data": section})


def test_one_jsonl_file_splits_by_document_and_trains_on_the_field_only(tmp_path: Path) -> None:
    docs = _docs()
    setup = RunSetup.from_manifest(_manifest([str(_jsonl(tmp_path / "train.jsonl", docs))]))
    corpus = setup.corpus
    assert len(corpus.train) > 0 and len(corpus.held_out) > 0  # one file, both sides
    train = corpus.train.numpy().tobytes().decode()
    held = corpus.held_out.numpy().tobytes().decode()
    assert '"text"' not in train and "{" not in train  # the record's text, not its JSON
    train_docs, held_docs = set(train.split("\n\n")) - {""}, set(held.split("\n\n")) - {""}
    assert train_docs | held_docs == set(docs) and not train_docs & held_docs  # whole documents, each once
    assert 0 < len(held_docs) < len(docs) * 0.15
    x, y = setup.batch(3)
    assert x.shape == (2, 16) and torch.equal(x[:, 1:], y[:, :-1])


def test_the_same_tokens_from_jsonl_parquet_and_a_folder_on_every_node(tmp_path: Path, _cache: Path) -> None:
    docs = _docs()
    j = RunSetup.from_manifest(_manifest([str(_jsonl(tmp_path / "a" / "d.jsonl", docs))])).corpus
    p = RunSetup.from_manifest(_manifest([str(_parquet(tmp_path / "b" / "d.parquet", docs))])).corpus
    folder = RunSetup.from_manifest(_manifest([str(tmp_path / "b")])).corpus  # a folder of Parquet files
    globbed = RunSetup.from_manifest(_manifest([str(tmp_path / "*" / "d.*")]))  # a glob: both files, in order
    assert j.digest() == p.digest() == folder.digest()
    assert len(globbed.corpus.train) == 2 * len(j.train)


def test_shards_whose_other_fields_differ_read_as_one_corpus(tmp_path: Path) -> None:
    docs = _docs()
    _jsonl(tmp_path / "d" / "a.jsonl", docs[:200])
    (tmp_path / "d" / "b.jsonl").write_text(
        "".join(json.dumps({"text": d, "meta": {"x": 1}}) + "\n" for d in docs[200:])
    )
    corpus = RunSetup.from_manifest(_manifest([str(tmp_path / "d")])).corpus
    same = RunSetup.from_manifest(_manifest([str(_jsonl(tmp_path / "one.jsonl", docs))])).corpus
    assert corpus.digest() == same.digest()


def test_text_files_split_by_paragraph(tmp_path: Path) -> None:
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "one.txt").write_text("\n\n".join(_docs(300)))
    corpus = RunSetup.from_manifest(_manifest([str(tmp_path / "books")])).corpus
    assert len(corpus.held_out) > 0 and len(corpus.train) > 0


def test_the_cache_is_memory_mapped_reused_and_rebuilt_when_damaged(tmp_path: Path, _cache: Path) -> None:
    spec = CacheSpec(resolve([str(_jsonl(tmp_path / "d.jsonl", _docs()))]))
    corpus = open_or_build(spec, Tokens.bytes(), _cache)
    (folder,) = [p for p in _cache.iterdir() if not p.name.startswith(".")]
    maps = Path("/proc/self/maps")
    if maps.exists():  # the split is a file mapping, not a copy in RAM
        assert str(folder / "train.bin") in maps.read_text()
    mtime = (folder / "meta.json").stat().st_mtime_ns
    assert torch.equal(open_or_build(spec, Tokens.bytes(), _cache).train, corpus.train)
    assert (folder / "meta.json").stat().st_mtime_ns == mtime  # reused, not rebuilt
    digest = corpus.digest()
    del corpus
    data = bytearray((folder / "train.bin").read_bytes())
    data[10] ^= 1
    (folder / "train.bin").write_bytes(bytes(data))
    assert open_or_build(spec, Tokens.bytes(), _cache).digest() == digest  # damage found, rebuilt


def test_nodes_of_one_machine_building_one_cache_at_once_agree(tmp_path: Path, _cache: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    spec = CacheSpec(resolve([str(_jsonl(tmp_path / "d.jsonl", _docs()))]))
    with ThreadPoolExecutor(3) as pool:  # a validator and two miners starting together
        digests = list(pool.map(lambda _: open_or_build(spec, Tokens.bytes(), _cache).digest(), range(3)))
    assert len(set(digests)) == 1
    assert len([p for p in _cache.iterdir() if not p.name.startswith(".")]) == 1  # one cache, no leftovers
    assert not [p for p in _cache.iterdir() if p.name.startswith(".")]


def test_a_tokenizer_gives_ids_with_end_of_text_between_records(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        _docs(), trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], initial_alphabet=alphabet)
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(tmp_path / "tok")
    spec = CacheSpec(resolve([str(_jsonl(tmp_path / "d.jsonl", _docs()))]))
    corpus = open_or_build(spec, Tokens.of(fast, sorted((tmp_path / "tok").iterdir())), tmp_path / "c")
    assert corpus.train.dtype == torch.int32
    eos = fast.eos_token_id
    ends = int((corpus.train == eos).sum() + (corpus.held_out == eos).sum())
    assert ends == len(_docs())  # one per document
    assert len(corpus.train) < sum(len(d) for d in _docs())  # merged tokens, not bytes


def test_the_embedded_corpus_is_still_the_default() -> None:
    setup = RunSetup.from_manifest(parse_manifest({"name": "tiny"}))
    assert setup.manifest.data.kind == "embedded"
    assert setup.corpus.digest() == stdlib_corpus(setup.manifest.data.cap_bytes).digest()


def test_the_embedded_corpus_lists_the_sources_in_path_order_outside_installed_packages(tmp_path: Path) -> None:
    names = ["z.py", "a.py", "a/b.py", "a/b/c.py", "ab.py", "email/mime/text.py", "notes.txt"]
    skipped = ["site-packages/big/mod.py", "a/__pycache__/b.py", "a/dist-packages/x.py"]
    for name in names + skipped:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    listed = [str(p.relative_to(tmp_path)) for p in stdlib_sources(tmp_path)]
    # sorted as path strings ("a/b.py" before "ab.py"), whatever order the file system lists them in
    assert listed == ["a.py", "a/b.py", "a/b/c.py", "ab.py", "email/mime/text.py", "z.py"]


def test_a_pinned_digest_refuses_other_tokens(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = str(_jsonl(tmp_path / "d.jsonl", _docs()))
    digest = RunSetup.from_manifest(_manifest([path])).corpus.digest()
    assert "data.digest is not set" in caplog.text and f'pin them with digest = "{digest}"' in caplog.text
    assert RunSetup.from_manifest(_manifest([path], digest=digest)).corpus.digest() == digest
    _jsonl(tmp_path / "d.jsonl", _docs()[:-1])  # another node's copy lacks a line
    with pytest.raises(ConfigError, match=rf"data.digest: .* the run's are {digest}"):
        RunSetup.from_manifest(_manifest([path], digest=digest)).corpus  # noqa: B018


def test_the_split_is_part_of_the_run_id(tmp_path: Path) -> None:
    a, b = _manifest(["x.jsonl"]), _manifest(["x.jsonl"], held_out_percent=10)
    assert a.run_id != b.run_id


def _bad_utf8(tmp_path: Path) -> str:
    (tmp_path / "latin1.txt").write_bytes("café au lait\n\n".encode("latin1") * 50)
    return str(tmp_path / "latin1.txt")


def _empty_folder(tmp_path: Path) -> str:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".hidden").write_text("not data")
    return str(tmp_path / "empty")


def _other_field(tmp_path: Path) -> str:
    return str(_jsonl(tmp_path / "d.jsonl", _docs(), field="content"))


def _parquet_text(tmp_path: Path) -> str:
    return str(_parquet(tmp_path / "d.parquet", _docs()))


def _three_docs(tmp_path: Path) -> str:
    return str(_jsonl(tmp_path / "d.jsonl", _docs(3)))


@pytest.mark.parametrize(
    ("make", "data", "says"),
    [
        (_empty_folder, {}, r"empty folder: put \.txt, \.jsonl or \.parquet files in it"),
        (_other_field, {}, r"no text field 'text' .*content.* set data\.field"),
        (_bad_utf8, {}, r"latin1\.txt is not UTF-8 text \(bad byte near offset 3\): convert it"),
        (_parquet_text, {"field": "body"}, r"d\.parquet has no column 'body' \(columns: text, n\)"),
        (_three_docs, {}, r"the held-out split of .*d\.jsonl has \d+ tokens.* add text"),
        (lambda t: str(t / "nothing" / "*.jsonl"), {}, r"the pattern matches no file"),
    ],
    ids=["empty-folder", "wrong-field", "not-utf8", "parquet-no-field", "too-small", "glob-no-match"],
)
def test_bad_data_gets_one_line_naming_the_file(tmp_path: Path, make, data, says) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=says) as err:
        RunSetup.from_manifest(_manifest([path], **data)).corpus  # noqa: B018
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["qwen2.5-0.5b-home-gpu", "qwen2.5-1.5b-home-gpu"])
def test_a_home_preset_starts_with_only_the_key_and_the_paths_edited(tmp_path: Path, name: str) -> None:
    from tests.test_hfmodel import _save_tiny_lm

    vocab = _save_tiny_lm(tmp_path / "model")
    _jsonl(tmp_path / "data" / "corpus.jsonl", [d * 4 for d in _docs(600)])
    text = preset(name).read_text()
    size = "1.5B" if "1.5b" in name else "0.5B"
    edits = {
        "validators = []": f'validators = ["{"ab" * 32}"]',
        f'path = "~/models/Qwen2.5-{size}"': f'path = "{tmp_path / "model"}"',
        'paths = ["~/data"]': f'paths = ["{tmp_path / "data"}"]',
    }
    for old, new in edits.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (tmp_path / "run.toml").write_text(text)
    setup = RunSetup.from_manifest(load_manifest(tmp_path / "run.toml"))
    x, _ = setup.batch(0)
    assert x.shape == (4, 1024) and int(x.max()) < vocab  # the model's own tokenizer, the preset's batch
    assert len(setup.held_out()) == setup.manifest.selection.held_out_batches
