"""A miner's local work in a round: H inner steps from W_r on its assignment, then compression.

    trainer = Trainer(setup, identity)
    delta = trainer.train(r, weights)                       # FP32 W_r - W_local after H AdamW steps
    header, payload = trainer.package(r, delta, weights, base_hash)

It holds its model, its optimizer and one error-feedback buffer; nothing grows with the number of
peers. `train.memory` in the manifest sets what these cost (BF16 moments, activation checkpointing,
a BF16 error buffer); the model lives on `device`, the error buffer and the codec's work on the
host. RL runs use `node.roles.rl.miner.RLTrainer`, which trains GRPO on rollouts instead.
"""

from __future__ import annotations

import torch

from node.learn.train import apply_memory, autocast, inner_train, load_bf16_state, make_optimizer, unique_state
from node.run.manifest import codec_for
from node.run.setup import RunSetup
from protocol.assignment import Assignment
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.state import State


class Trainer:
    """H inner steps from W_r on this miner's assignment, compressed with error feedback."""

    def __init__(self, setup: RunSetup, identity: Identity, device: str = "cpu") -> None:
        self.setup, self.identity = setup, identity
        m = setup.manifest
        self.device = torch.device(device)
        # BF16 autocast only where the manifest asks for it and the device has it (CUDA)
        self.autocast = m.model.precision == "bf16-autocast" and self.device.type == "cuda"
        self.codec = codec_for(m)
        self.model = setup.new_model(initial=False).to(self.device)  # W_r is loaded before every round
        apply_memory(self.model, m.train.memory)
        self.optimizer = make_optimizer(self.model, m.train.inner, m.train.memory)
        self.error: State | None = None
        self.steps_done = 0
        self.last_loss = float("nan")

    def train(self, round_: int, weights: State) -> State:
        """FP32 pseudo-gradient W - W_local after H steps from `weights` on this miner's round-`round_` data."""
        m = self.setup.manifest
        assignment = self.assignment(round_)
        load_bf16_state(self.model, weights)
        first = self.steps_done

        def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = self.setup.batch(assignment.step_seed(step - first))
            return x.to(self.device), y.to(self.device)

        with autocast(self.device, self.autocast, m.train.memory):
            losses = inner_train(
                self.model, m.train.inner, batch, m.train.inner_steps, optimizer=self.optimizer, first_step=first
            )
        self.optimizer.zero_grad(set_to_none=True)  # free the gradients before the delta and the codec run
        self.steps_done += m.train.inner_steps
        self.last_loss = sum(losses) / len(losses)
        local = unique_state(self.model)
        return {name: weights[name].float() - local[name].detach().float().cpu() for name in weights}

    def package(self, round_: int, delta: State, weights: State, base_hash: str) -> tuple[SubmissionHeader, bytes]:
        """Compress `delta` plus the error buffer against the BF16 `weights` of `round_`, and sign-ready header."""
        m = self.setup.manifest
        error = None if self.error is None else {n: e.float() for n, e in self.error.items()}
        payload, new_error, _ = self.codec.compress(delta, error, weights)
        del error
        self.error = {n: e.to(m.train.memory.error_dtype) for n, e in new_error.items()}
        header = SubmissionHeader.for_payload(
            run_id=self.setup.run_id,
            round_=round_,
            base_hash=base_hash,
            payload=payload,
            codec=m.train.codec,
            data_digest=self.assignment(round_).digest,
            sender=self.identity.public_hex,
        )
        return header, payload

    def assignment(self, round_: int) -> Assignment:
        batches = self.setup.manifest.selection.assignment_batches
        return Assignment(self.setup.run_id, round_, self.identity.public_hex, batches)
