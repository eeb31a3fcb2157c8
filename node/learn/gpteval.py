"""The run's model (a `CausalLM`: embedded GPT or Hugging Face) as the validator's `Evaluator`, and its batch source.

The validator library never imports the model: the node hands it this adapter and a function
from batch seed to batch, the same one miners draw their assignment with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from node.learn.data import Corpus
from node.learn.model import CausalLM
from node.learn.train import Batch, unique_state


class GPTEvaluator:
    """Loads base - step * update into a model's FP32 parameters and measures mean loss.

    The model may live on any device (CUDA for a validator with a GPU): states and batches come
    from the host and are moved a tensor at a time, so no second copy of the weights is made.
    """

    def __init__(self, model: CausalLM) -> None:
        self.model = model.eval()
        self._params = unique_state(model)
        self.device = next(iter(self._params.values())).device

    def load(
        self, base: Mapping[str, torch.Tensor], update: Mapping[str, torch.Tensor] | None = None, step: float = 0.0
    ) -> None:
        with torch.no_grad():
            for name, param in self._params.items():
                param.copy_(base[name])
                if update is not None and step != 0.0:
                    param.sub_(update[name].to(self.device), alpha=step)

    def loss(self, batch: Batch) -> float:
        x, y = batch
        with torch.no_grad():
            return float(self.model.loss(x.to(self.device), y.to(self.device)))


def batch_source(corpus: Corpus, batch_size: int, seq_len: int) -> Callable[[int], Batch]:
    """Seed -> training batch: what a miner trains on and what the validator redraws."""
    return lambda seed: corpus.batch(seed, batch_size, seq_len)
