"""The one name for a model state: tensors by parameter name.

`State` is what a function reads (any mapping, never modified); `StateDict` is a dict the
holder owns and may change, as `torch`'s own `state_dict()` returns.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

State = Mapping[str, torch.Tensor]
StateDict = dict[str, torch.Tensor]
