"""A Hugging Face causal LM as a `CausalLM` the rest of the node uses as is: from a local directory,
or from its architecture alone with seeded initial weights.

    model, tokenizer = load_hf_model(path), load_hf_tokenizer(path)   # weights and tokenizer on disk
    model = build_hf_from_config(QWEN2_5_0_5B, seed=0)                # architecture only, seeded
    model = hf_skeleton(config)        # the architecture with zero weights, for a node that loads a state
    model.loss(x, y)                   # like the embedded GPT: mean next-token cross-entropy
    tokenize_corpus(corpus, tokenizer) # byte corpus -> token corpus, same seeded batches

Nothing is downloaded: files are read with `local_files_only=True`, so every node of a run
must hold the same directory. Weights are FP32 (the master precision); tied weights (e.g.
`lm_head.weight` -> the input embedding) are one tensor, which `unique_state` lists once.

Seeded initialization (`seeded_init`) does not use transformers' own init: every tensor draws
from its own generator, seeded by (seed, the tensor's name), with the rule transformers applies
to Llama/Qwen-family models (matrices and embeddings N(0, initializer_range), norm gains 1,
biases 0). It skips transformers' double initialization (about 30 s at 0.5B on a CPU) and does not
depend on the order modules are built in. Only the validator's W_0 comes from it: every other
node loads the validator's checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from node.learn.data import Corpus
from node.learn.model import CausalLM
from node.learn.train import derive_seed
from protocol.errors import ConfigError

# Model types whose logits are a plain linear head on the base model's last hidden state, so
# the loss can be computed a chunk of tokens at a time (no (B, T, V) logits tensor).
_PLAIN_HEAD_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral", "gpt2"})
LOSS_CHUNK_TOKENS = 256  # at V = 151,936 one chunk's FP32 logits are 156 MB; (4, 1024) tokens' would be 2.5 GB
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class HFCausalLM(CausalLM):
    """Wraps a `transformers` causal LM: forward gives logits (B, T, V) for token ids (B, T)."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm  # state-dict names are the model's own, prefixed with "lm."
        for module in lm.modules():  # no dropout: inner steps draw no random numbers (node/learn/train.py)
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        self.block_size = int(getattr(lm.config, "max_position_embeddings", 0) or 0)
        self.chunked_loss = getattr(lm.config, "model_type", None) in _PLAIN_HEAD_TYPES
        self.loss_chunk = LOSS_CHUNK_TOKENS

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self._check_length(idx)
        logits: torch.Tensor = self.lm(input_ids=idx, use_cache=False).logits
        return logits.float()

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy; the head and the softmax run `loss_chunk` tokens at a time.

        In training each chunk's logits are recomputed in the backward pass (checkpointed), so
        at most one chunk of (tokens, V) logits is alive: the large-vocabulary head does not set
        the peak. Equal to the plain loss up to float summation order.
        """
        if not self.chunked_loss:
            return super().loss(x, y)
        self._check_length(x)
        hidden = self.lm.base_model(input_ids=x, use_cache=False).last_hidden_state  # (B, T, C)
        h, t = hidden.reshape(-1, hidden.size(-1)), y.reshape(-1)
        head = self.lm.get_output_embeddings()

        def chunk_sum(hc: torch.Tensor, tc: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(head(hc).float(), tc, reduction="sum")

        total = h.new_zeros((), dtype=torch.float32)
        for start in range(0, t.numel(), self.loss_chunk):
            hc, tc = h[start : start + self.loss_chunk], t[start : start + self.loss_chunk]
            if torch.is_grad_enabled():
                total = total + checkpoint(chunk_sum, hc, tc, use_reentrant=False)
            else:
                total = total + chunk_sum(hc, tc)
        return total / t.numel()

    def set_checkpointing(self, enabled: bool) -> None:
        # transformers 5 names it activation_checkpointing_*, 4.x gradient_checkpointing_*
        kind = "activation" if hasattr(self.lm, "activation_checkpointing_enable") else "gradient"
        if enabled:
            options = {f"{kind}_checkpointing_kwargs": {"use_reentrant": False}}
            getattr(self.lm, f"{kind}_checkpointing_enable")(**options)
        else:
            getattr(self.lm, f"{kind}_checkpointing_disable")()

    def _check_length(self, idx: torch.Tensor) -> None:
        if self.block_size and idx.shape[1] > self.block_size:
            raise ValueError(f"sequence of {idx.shape[1]} tokens exceeds the model's {self.block_size}")


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


def read_config(path: str) -> dict[str, Any]:
    """The config.json under `path` as a dict (what `build_hf_from_config` takes)."""
    import json

    root = model_dir(path)
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.path: {root / 'config.json'} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"model.path: {root / 'config.json'} is not a JSON object")
    check_shape_fields(config, where=f"model.path: {root / 'config.json'}")
    return config


# The fields that size a model: transformers fills a missing one with its default, so a config.json
# of two fields built a multi-GB default model instead of failing. Names are the canonical ones; a
# model type's own alias (gpt2's n_embd for hidden_size) counts (`attribute_map`).
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
MLP_FIELD_TYPES = _PLAIN_HEAD_TYPES - {"gpt2"}  # these also need intermediate_size


def check_shape_fields(config: dict[str, Any], where: str = "model config") -> None:
    """`ConfigError` naming every field that sizes the model and is missing from `config`."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ConfigError(f"{where}: model_type {model_type!r} is not one transformers knows")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return  # not a causal LM at all: loading it says so (`load_hf_model`)
    aliases = getattr(CONFIG_MAPPING[model_type], "attribute_map", {})
    needed = SHAPE_FIELDS + (("intermediate_size",) if model_type in MLP_FIELD_TYPES else ())
    missing = [name for name in needed if name not in config and aliases.get(name) not in config]
    if missing:
        raise ConfigError(f"{where}: lacks {', '.join(missing)}, which a {model_type} model needs (no defaults taken)")


# Qwen2.5's published architectures (the config.json fields that shape the model). 0.5B is about
# 494M parameters, 0.99 GB in BF16; the larger ones serve the memory projections (`pulse bench scale`)
# and a GPU measurement of the 1.5B miner. Nothing is downloaded.
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
QWEN2_5_1_5B: dict[str, Any] = {
    **QWEN2_5_0_5B,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "max_window_layers": 21,
}
QWEN2_5_7B: dict[str, Any] = {
    **QWEN2_5_0_5B,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "max_window_layers": 28,
}
QWEN2_5_72B: dict[str, Any] = {
    **QWEN2_5_7B,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "max_window_layers": 80,
}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": QWEN2_5_0_5B,
    "qwen2.5-1.5b": QWEN2_5_1_5B,
    "qwen2.5-7b": QWEN2_5_7B,
    "qwen2.5-72b": QWEN2_5_72B,
}


def _auto_config(config: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    check_shape_fields(config)
    fields = dict(config)
    model_type = str(fields.pop("model_type"))
    try:
        return AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"model config: {exc}") from exc


@contextlib.contextmanager
def _without_init() -> Iterator[None]:
    """transformers' `no_init_weights` (v5: `transformers.initialization`, v4: `modeling_utils`)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights  # type: ignore[attr-defined,no-redef]
    with no_init_weights():
        yield


def hf_skeleton(config: dict[str, Any], device: str | torch.device = "cpu") -> HFCausalLM:
    """`config`'s architecture with every weight zero (buffers such as rotary tables are real), FP32.

    For nodes that load a state right away (miners, followers, the validator's evaluator): it
    skips the random draws entirely.
    """
    from transformers import AutoModelForCausalLM

    cfg = _auto_config(config)
    with _without_init(), torch.device(device):
        lm = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    lm.tie_weights()  # post_init's tying is part of the skipped init
    with torch.no_grad():
        for p in lm.parameters():
            p.zero_()  # skipped init leaves uninitialized memory
    return HFCausalLM(lm)


def seeded_init(model: HFCausalLM, seed: int) -> None:
    """Draw every weight of `model` from (seed, its name); see the module docstring for the rule."""
    std = float(getattr(model.lm.config, "initializer_range", None) or 0.02)
    seen: set[int] = set()
    with torch.no_grad():
        for module_name, module in model.lm.named_modules():
            for pname, p in module.named_parameters(recurse=False):
                if id(p) in seen:
                    continue  # tied: drawn once, under its first name
                seen.add(id(p))
                _init_one(module, f"{module_name}.{pname}", pname, p, seed, std)


def _init_one(module: nn.Module, name: str, pname: str, p: torch.Tensor, seed: int, std: float) -> None:
    from transformers.pytorch_utils import Conv1D

    if pname == "bias":
        p.zero_()
    elif isinstance(module, nn.Linear | nn.Embedding | Conv1D) and pname == "weight":
        gen = torch.Generator().manual_seed(derive_seed("hf-init", seed, name))
        if p.device.type == "cpu":
            p.normal_(0.0, std, generator=gen)
        else:
            p.copy_(torch.empty(p.shape).normal_(0.0, std, generator=gen))
    elif "Norm" in type(module).__name__ and pname == "weight":
        p.fill_(1.0)
    else:
        raise ConfigError(f"seeded init has no rule for {name} ({type(module).__name__}); use init = 'pretrained'")


def build_hf_from_config(config: dict[str, Any], seed: int, device: str | torch.device = "cpu") -> HFCausalLM:
    """A causal LM of `config`'s architecture (a config.json as a dict) with seeded initial weights, FP32."""
    model = hf_skeleton(config, device)
    seeded_init(model, seed)
    return model


def count_hf_parameters(config: dict[str, Any]) -> int:
    """Parameters of `config`'s architecture (tied ones once), counted on the meta device: no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(_auto_config(config))
    return sum(p.numel() for p in lm.parameters())


def has_tokenizer(path: str) -> bool:
    root = model_dir(path)
    return any((root / name).is_file() for name in TOKENIZER_FILES)


def tokenizer_files(path: str) -> list[Path]:
    """The files under `path` that decide its tokenizer's ids (what a token cache is keyed by)."""
    extra = ("special_tokens_map.json", "merges.txt", "added_tokens.json")
    return sorted(p for p in model_dir(path).iterdir() if p.name in TOKENIZER_FILES + extra and p.is_file())


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
