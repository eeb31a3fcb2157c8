"""A GPU owner's first run, walked on the CPU: their model directory (with its own tokenizer), their
data as one JSONL file and a Parquet folder, the home preset with only the paths edited and the sizes
shrunk, three rounds of a real swarm, then the export loaded in transformers and generating text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from node.commands.cli import main
from node.learn.data import stdlib_corpus
from node.run.manifest import load_manifest, parse_manifest
from node.run.presets import preset

pytestmark = [pytest.mark.swarm, pytest.mark.light]
transformers = pytest.importorskip("transformers")
pytest.importorskip("datasets")

DOCS = 240  # per dataset; 5% held out by document hash, so a dozen held-out documents each


def _documents(count: int, skip: int) -> list[str]:
    """Real text: pieces of the embedded corpus (the standard library's sources), 1.5 kB each."""
    text = stdlib_corpus(2 * 2**20).train.numpy().tobytes().decode("utf-8", errors="ignore")
    return [text[i * 1500 : (i + 1) * 1500] for i in range(skip, skip + count)]


def _model_dir(root: Path) -> Path:
    """A tiny Qwen2 with a byte-level BPE tokenizer trained here on the embedded corpus, saved as a
    Hugging Face model directory (config.json, weights, tokenizer files): what a user downloads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.test_seeded_model import TINY_QWEN

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(_documents(400, 0), trainers.BpeTrainer(vocab_size=512, initial_alphabet=alphabet,
                                                                    special_tokens=["<|endoftext|>"]))  # fmt: skip
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    eos = fast.eos_token_id
    config = {**TINY_QWEN, "vocab_size": len(fast), "bos_token_id": eos, "eos_token_id": eos}
    model_type = config.pop("model_type")
    torch.manual_seed(0)
    lm = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **config))
    lm.save_pretrained(root)
    fast.save_pretrained(root)
    return root


def _datasets(root: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    jsonl = root / "train.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d, "source": "stdlib"}) + "\n" for d in _documents(DOCS, 400)))
    (root / "parquet").mkdir()
    pq.write_table(pa.table({"text": _documents(DOCS, 400 + DOCS)}), root / "parquet" / "part-0.parquet")
    return [str(jsonl), str(root / "parquet")]


def test_home_preset_on_own_model_and_data(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "models" / "tiny")
    data = load_manifest(preset("qwen2.5-0.5b-home-gpu")).model_dump(mode="python")
    data["model"]["path"] = str(model)  # the edits a user makes: the paths ...
    data["data"]["paths"] = _datasets(tmp_path / "data")
    # ... and, for a CPU test, the sizes shrunk; a toy model at a fine-tuning rate would not move
    data["data"].update(batch_size=2, seq_len=32)
    data["train"]["inner_steps"] = 2
    data["train"]["inner"]["lr"] = 1e-3
    data["round"].update(deadline_seconds=30.0, min_seconds=0.0)
    data["selection"].update(eval_batch_size=2, held_out_batches=2, assignment_batches=2, min_indicator_average=0.0)
    config = tmp_path / "home.toml"
    config.write_text(parse_manifest(data).to_toml())

    env = {**os.environ, "PULSE_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "node", "demo", "--config", str(config), "--miners", "2", "--rounds", "3"]
    done = subprocess.run(
        [*cmd, "--device", "cpu", "--out", str(out), "--json"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["rounds"] == 3 and summary["hashes_agree"] and summary["clean_shutdown"]
    assert summary["loss_last"] < summary["loss_first"]
    logs = "".join(p.read_text() for p in (out / "logs").glob("*.log"))
    assert "tokens are bytes" not in logs  # the model's own tokenizer
    digests = [line.rsplit("digest ", 1)[1][:64] for line in logs.splitlines() if "held-out tokens, digest" in line]
    assert len(digests) >= 3 and len(set(digests)) == 1  # the validator and both miners: the same tokens

    exported = tmp_path / "export"
    flags = ["--state-dir", str(out / "validator"), "--config", str(out / "run.toml"), "--out", str(exported)]
    assert main(["export", *flags]) == 0
    lm = transformers.AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
    prompt = tokenizer("def __init__(self", return_tensors="pt")
    generated = lm.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert generated.shape[1] > prompt["input_ids"].shape[1]
    assert tokenizer.decode(generated[0]).startswith("def __init__(self")
