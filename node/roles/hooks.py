"""What the validator service does around each round that depends on the task: `RoundHooks`.

    await hooks.before_open(r, state_hash, states, w_r)   # RL: build, check and publish the rollout pool
    measured = hooks.baseline(w0)                    # held-out loss (LM) or reward (RL) of W_0
    measured = hooks.after_close(r, w_next)          # the same for W_{r+1}

`baseline` and `after_close` are CPU work: the service runs them in an executor. This file holds
the protocol, what a measurement is, and the language modelling hooks; the RL hooks are in
`rl/validation.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from node.learn.model import CausalLM
from node.learn.train import Batch, evaluate, load_bf16_state
from protocol.state import State


@dataclass(frozen=True)
class HeldOut:
    """A held-out measure of the weights the validator holds; None where the task measures nothing."""

    loss: float | None = None
    reward: float | None = None

    @property
    def measured(self) -> bool:
        return self.loss is not None or self.reward is not None

    def describe(self) -> str:
        """'loss 3.1234', 'reward 0.4321', both, or '' when nothing was measured."""
        named = (("loss", self.loss), ("reward", self.reward))
        return ", ".join(f"{name} {value:.4f}" for name, value in named if value is not None)


class RoundHooks(Protocol):
    async def before_open(self, round_: int, state_hash: str, states: Mapping[int, str], weights: State) -> None:
        """Before round `round_` opens: `weights` is W_round (BF16), hashing to `state_hash`; `states`: round ->
        hash the book keeps."""

    def baseline(self, weights: State) -> HeldOut:
        """The held-out measure of W_0, before round 0."""

    def after_close(self, round_: int, weights: State) -> HeldOut:
        """The held-out measure of W_{round_+1}, once round `round_` closed."""


class HeldOutLoss:
    """Language modelling: the held-out loss after every round (nothing to do before one opens)."""

    def __init__(self, probe: CausalLM, held_out: list[Batch]) -> None:
        self.probe, self.held_out = probe, held_out

    async def before_open(self, round_: int, state_hash: str, states: Mapping[int, str], weights: State) -> None:
        return None

    def baseline(self, weights: State) -> HeldOut:
        return self._measure(weights)

    def after_close(self, round_: int, weights: State) -> HeldOut:
        return self._measure(weights)

    def _measure(self, weights: State) -> HeldOut:
        if not self.held_out:  # a manifest may ask for no held-out batches
            return HeldOut()
        load_bf16_state(self.probe, weights)
        return HeldOut(loss=evaluate(self.probe, self.held_out))
