"""A Hugging Face causal LM from a local directory, as a `CausalLM` the rest of the node uses as is.

    model, tokenizer = load_hf(Path("~/models/Qwen2.5-0.5B"))
    model.loss(x, y)                  # like the embedded GPT: mean next-token cross-entropy
    tokenize_corpus(corpus, tokenizer)  # byte corpus -> token corpus, same seeded batches

Nothing is downloaded: files are read with `local_files_only=True`, so every node of a run
must hold the same directory. Weights load in FP32 (the master precision); tied weights (e.g.
`lm_head.weight` -> the input embedding) are one tensor, which `unique_state` lists once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from node.learn.data import Corpus
from node.learn.model import CausalLM
from protocol.errors import ConfigError


class HFCausalLM(CausalLM):
    """Wraps a `transformers` causal LM: forward gives logits (B, T, V) for token ids (B, T)."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm  # state-dict names are the model's own, prefixed with "lm."
        for module in lm.modules():  # no dropout: inner steps draw no random numbers (node/learn/train.py)
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        self.block_size = int(getattr(lm.config, "max_position_embeddings", 0) or 0)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.block_size and idx.shape[1] > self.block_size:
            raise ValueError(f"sequence of {idx.shape[1]} tokens exceeds the model's {self.block_size}")
        logits: torch.Tensor = self.lm(input_ids=idx, use_cache=False).logits
        return logits.float()


def model_dir(path: str) -> Path:
    """The model directory, or a `ConfigError` if it is not a directory with a config.json."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ConfigError(f"model.path: not a directory: {root}")
    if not (root / "config.json").is_file():
        raise ConfigError(f"model.path: no config.json in {root} (not a Hugging Face model directory)")
    return root


def load_hf_model(path: str) -> HFCausalLM:
    """The causal LM under `path` in FP32, read offline; `ConfigError` if it is missing or not a causal LM."""
    from transformers import AutoModelForCausalLM  # heavy import, only for runs of kind 'hf'

    root = model_dir(path)
    try:
        lm = AutoModelForCausalLM.from_pretrained(root, local_files_only=True, dtype=torch.float32)
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(f"model.path: {root} does not hold a causal LM: {exc}") from exc
    return HFCausalLM(lm)


# Qwen2.5-0.5B's architecture (its published config.json, the fields that shape the model): about
# 494M parameters, 0.99 GB in BF16. Benchmarks build it with seeded weights; nothing is downloaded.
QWEN2_5_0_5B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": 32768,
    "max_window_layers": 24,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
}


def build_hf_from_config(config: dict[str, Any], seed: int) -> HFCausalLM:
    """A causal LM of `config`'s architecture (a config.json as a dict) with seeded initial weights, FP32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ConfigError("model config: no model_type")
    try:
        cfg = AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"model config: {exc}") from exc
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return HFCausalLM(lm)


def load_hf_tokenizer(path: str) -> Any:
    """The tokenizer saved beside the model under `path`, read offline."""
    from transformers import AutoTokenizer

    root = model_dir(path)
    try:
        return AutoTokenizer.from_pretrained(root, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(f"model.path: no usable tokenizer in {root}: {exc}") from exc


def tokenize_corpus(corpus: Corpus, tokenizer: Any) -> Corpus:
    """The byte corpus as token ids (int64) of `tokenizer`, split for split; batches are drawn alike."""

    def ids(data: torch.Tensor) -> torch.Tensor:
        text = data.numpy().tobytes().decode("utf-8", errors="replace")
        tokens = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        return torch.from_numpy(np.asarray(tokens, dtype=np.int64))

    return Corpus(train=ids(corpus.train), held_out=ids(corpus.held_out))
