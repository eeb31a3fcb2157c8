"""The embedded GPT as a Hugging Face GPT-2, exactly, and a byte-level tokenizer for it.

    hf = to_gpt2(weights)             # pulse names -> GPT-2 names (what model.safetensors holds)
    weights = from_gpt2(hf, cfg)      # back, exactly (the state hash is over pulse's names)
    config = gpt2_config(cfg)         # config.json of the matching GPT2LMHeadModel
    byte_tokenizer().save_pretrained(folder)   # token id = byte value

The embedded GPT (`model.py`) is GPT-2's architecture with four differences, each made exact:

| embedded GPT | GPT-2 | export |
|---|---|---|
| `nn.Linear` weights (out, in) | `Conv1D` weights (in, out) | transposed |
| no biases on qkv, proj, mlp | biases on `c_attn`, `c_proj`, `c_fc`, `mlp.c_proj` | zeros: adding 0.0 changes nothing |
| `nn.GELU()` (exact, erf) | `gelu_new` (tanh approximation) by default | `activation_function = "gelu"` (erf) |
| `nn.LayerNorm` eps 1e-5 | `layer_norm_epsilon` 1e-5 | as is |

Both are pre-norm (ln_1 -> attention -> residual, ln_2 -> MLP -> residual, final ln_f), use
learned position embeddings and tie the output head to the token embedding, split `c_attn`'s
output into q, k, v of n_embd each and heads as (n_head, head_dim), and scale scores by
1/sqrt(head_dim). So `GPT2LMHeadModel` with these weights gives the embedded GPT's logits
(tests/test_export.py compares them).

Tokens are bytes. The tokenizer is byte-level BPE with no merges: `tokenizers`' ByteLevel
pre-tokenizer maps byte b to GPT-2's printable stand-in character, whose id is b, so every byte
string maps to its bytes and back.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from node.learn.model import GPTConfig
from protocol.state import State, StateDict

# name inside block i -> (GPT-2 name inside transformer.h.i, whether it is a Linear that becomes a Conv1D)
_BLOCK = {
    "ln1.weight": ("ln_1.weight", False),
    "ln1.bias": ("ln_1.bias", False),
    "attn.qkv.weight": ("attn.c_attn.weight", True),
    "attn.proj.weight": ("attn.c_proj.weight", True),
    "ln2.weight": ("ln_2.weight", False),
    "ln2.bias": ("ln_2.bias", False),
    "mlp.0.weight": ("mlp.c_fc.weight", True),
    "mlp.2.weight": ("mlp.c_proj.weight", True),
}
_TOP = {
    "wte.weight": "transformer.wte.weight",
    "wpe.weight": "transformer.wpe.weight",
    "ln_f.weight": "transformer.ln_f.weight",
    "ln_f.bias": "transformer.ln_f.bias",
}
_ZERO_BIASES = ("attn.c_attn.bias", "attn.c_proj.bias", "mlp.c_fc.bias", "mlp.c_proj.bias")
_BLOCK_NAME = re.compile(r"^blocks\.(\d+)\.(.+)$")


def gpt2_config(cfg: GPTConfig) -> dict[str, Any]:
    """The fields of config.json for a GPT2LMHeadModel that computes what the embedded GPT of `cfg` does."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": 4 * cfg.n_embd,
        "activation_function": "gelu",  # nn.GELU's exact erf form, not GPT-2's tanh "gelu_new"
        "layer_norm_epsilon": 1e-5,  # nn.LayerNorm's default
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def to_gpt2(weights: State) -> StateDict:
    """GPT-2 tensors (names, layout, zero biases) for the embedded GPT's unique state, dtype kept."""
    out: StateDict = {}
    for name, tensor in weights.items():
        if name in _TOP:
            out[_TOP[name]] = tensor.contiguous()
            continue
        match = _BLOCK_NAME.match(name)
        if match is None or match.group(2) not in _BLOCK:
            raise ValueError(f"{name}: not a tensor of the embedded GPT")
        target, linear = _BLOCK[match.group(2)]
        prefix = f"transformer.h.{match.group(1)}."
        if linear:  # (out, in) -> Conv1D's (in, out), and the bias GPT-2 has and the GPT lacks, zero
            out[prefix + target] = tensor.t().contiguous()
            out[prefix + target.removesuffix("weight") + "bias"] = torch.zeros(tensor.shape[0], dtype=tensor.dtype)
        else:
            out[prefix + target] = tensor.contiguous()
    return out


def from_gpt2(hf: State, cfg: GPTConfig) -> StateDict:
    """The embedded GPT's unique state from GPT-2 tensors; `ValueError` if names differ or a bias is not zero.

    `lm_head.weight`, if present, must equal `transformer.wte.weight` (they are tied).
    """
    expected = set(_TOP.values()) | {
        f"transformer.h.{i}.{name}"
        for i in range(cfg.n_layer)
        for name in (*(t for t, _ in _BLOCK.values()), *_ZERO_BIASES)
    }
    names = set(hf) - {"lm_head.weight"}
    if names != expected:
        raise ValueError(
            f"not the GPT-2 of this model: missing {sorted(expected - names)}, extra {sorted(names - expected)}"
        )
    head = hf.get("lm_head.weight")
    if head is not None and not torch.equal(head, hf["transformer.wte.weight"]):
        raise ValueError("lm_head.weight differs from transformer.wte.weight: not a tied model")
    for i in range(cfg.n_layer):
        for bias in _ZERO_BIASES:
            if torch.any(hf[f"transformer.h.{i}.{bias}"] != 0):
                raise ValueError(f"transformer.h.{i}.{bias} is not zero: the embedded GPT has no such bias")
    out: StateDict = {pulse: hf[name] for pulse, name in _TOP.items()}
    for i in range(cfg.n_layer):
        for pulse, (name, linear) in _BLOCK.items():
            tensor = hf[f"transformer.h.{i}.{name}"]
            out[f"blocks.{i}.{pulse}"] = tensor.t().contiguous() if linear else tensor
    return out


def byte_tokenizer(max_length: int | None = None) -> Any:
    """A `transformers` fast tokenizer whose token ids are the text's UTF-8 bytes (built offline)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    stand_in = _byte_stand_ins()
    tokenizer = Tokenizer(models.BPE(vocab={stand_in[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    kwargs = {"model_max_length": max_length} if max_length else {}
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **kwargs)


def _byte_stand_ins() -> dict[int, str]:
    """GPT-2's printable character for each byte, the alphabet of `tokenizers`' ByteLevel pre-tokenizer:
    printable Latin-1 bytes stand for themselves, the others for code points from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + n)
    return chars
