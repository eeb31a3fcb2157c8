"""Model configurations the tests share."""

from __future__ import annotations

from typing import Any

from node.learn.hfmodel import QWEN2_5_0_5B

# Qwen2.5-0.5B's architecture at toy sizes: the same modules, tied embeddings, a 300-id vocabulary
TINY_QWEN: dict[str, Any] = {
    **QWEN2_5_0_5B,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 128,
}
