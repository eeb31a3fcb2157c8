"""A Hugging Face causal LM from a local directory: loads offline, trains, and ships BF16 state like the GPT."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from node.learn.train import InnerOptimConfig, bf16_state, inner_train, load_bf16_state
from node.run.manifest import Manifest, parse_manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol import pulsesync
from protocol.errors import ConfigError
from protocol.statehash import state_hash

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _save_tiny_lm(root: Path) -> int:
    """A byte-level BPE tokenizer and a 1-layer GPT-2 built here, saved as a model directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()  # every byte has a token: no unknowns
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=alphabet, special_tokens=["<eos>"])
    tok.train_from_iterator(["def f(self, x):\n    return x + 1\n" * 20, "import os\nclass A:\n    pass\n"], trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    vocab = len(fast)
    cfg = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=vocab, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(root)
    fast.save_pretrained(root)
    return vocab


def _text_files(root: Path) -> list[str]:
    """300 small files: enough that the 5% held-out split (by path hash) is never empty (p ~ 2e-7)."""
    root.mkdir(exist_ok=True)
    paths = [root / f"f{i}.txt" for i in range(300)]
    for i, path in enumerate(paths):
        path.write_text(f"def f{i}(self, x):\n    return x + {i}\n\nclass A{i}:\n    pass\n" * 4)
    return [str(path) for path in paths]


def _manifest(path: Path) -> Manifest:
    return parse_manifest(
        {
            "name": "hf-tiny",
            "model": {"kind": "hf", "path": str(path)},
            "data": {"kind": "files", "paths": _text_files(path.parent / "text"), "batch_size": 4, "seq_len": 32},
            "train": {"inner_steps": 2, "codec": "pulseloco"},
        }
    )


def test_hf_model_trains_and_ships_bf16_state(tmp_path: Path) -> None:
    vocab = _save_tiny_lm(tmp_path / "model")
    setup = RunSetup.from_manifest(_manifest(tmp_path / "model"))
    x, y = setup.batch(3)
    assert x.shape == y.shape == (4, 32) and int(x.min()) >= 0 and int(x.max()) < vocab
    model = setup.new_model()
    w0 = bf16_state(model)
    assert "lm.transformer.wte.weight" in w0 and "lm.lm_head.weight" not in w0  # tied: listed once
    assert state_hash(w0) == state_hash(bf16_state(setup.new_model()))  # the same W_0 on every node

    losses = inner_train(model, InnerOptimConfig(lr=1e-2), setup.batch, 6)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    again = inner_train(setup.new_model(), InnerOptimConfig(lr=1e-2), setup.batch, 6)
    assert again == losses  # dropout is off: the same steps on every machine

    w1 = bf16_state(model)
    assert state_hash(pulsesync.apply(w0, pulsesync.encode(w0, w1))) == state_hash(w1)
    fresh = setup.new_model()
    load_bf16_state(fresh, w1)
    assert state_hash(bf16_state(fresh)) == state_hash(w1)

    task = task_for(setup)
    evaluator = task.evaluator()
    evaluator.load(task.initial_master())
    assert math.isfinite(evaluator.loss(task.batch_fn()(5)))


def test_missing_directory_fails_at_setup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.path"):
        RunSetup.from_manifest(_manifest(tmp_path / "nope"))


def test_not_a_causal_lm_fails_naming_the_path(tmp_path: Path) -> None:
    transformers.ViTConfig().save_pretrained(tmp_path / "model")  # a config.json, but an image model
    setup = RunSetup.from_manifest(_manifest(tmp_path / "model"))
    with pytest.raises(ConfigError, match="causal LM"):
        setup.new_model()


def test_a_model_from_its_architecture_alone_is_seeded() -> None:
    from node.learn.hfmodel import QWEN2_5_0_5B, build_hf_from_config

    tiny = {**QWEN2_5_0_5B, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300}  # fmt: skip
    a, b, c = build_hf_from_config(tiny, 1), build_hf_from_config(tiny, 1), build_hf_from_config(tiny, 2)
    same = [torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)]
    assert all(same)
    name = "lm.model.embed_tokens.weight"
    assert not torch.equal(a.state_dict()[name], c.state_dict()[name])
    x = torch.randint(0, 256, (2, 16))
    assert a(x).shape == (2, 16, 300)


def test_a_config_that_lacks_the_fields_its_architecture_needs_is_refused(tmp_path: Path) -> None:
    """Two fields used to build transformers' default model (about 5 GB); now the missing fields are named."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 64}')
    with pytest.raises(
        ConfigError, match="lacks num_hidden_layers, num_attention_heads, vocab_size, intermediate_size"
    ):
        RunSetup.from_manifest(_manifest(tmp_path / "model")).new_model()
    from node.learn.hfmodel import check_shape_fields

    check_shape_fields(
        {"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2, "vocab_size": 50}
    )  # aliases count
