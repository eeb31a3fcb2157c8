"""The run's task as one object, built once from the manifest: language modelling or RL.

    task = task_for(setup)
    task.initial_master()          # W_0, FP32 (the validator's first master weights)
    task.evaluator()               # the validator's `Evaluator` (a model of its own)
    task.batch_fn()                # the validator's batch function: seed -> scoring batch
    task.trainer(identity)         # a miner's `Trainer`

What the roles do differently per task on the network (the RL pool, rollout workers, held-out
measures) is in `node/roles/tasks.py`, built from this object; nothing in a role asks which task
it runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import torch

from node.learn.gpteval import GPTEvaluator
from node.learn.rl.config import RLConfig
from node.learn.rl.evaluator import GRPOEvaluator, PoolSource
from node.learn.rl.task import held_out_prompts
from node.learn.rl.warmstart import warm_start
from node.learn.train import Batch, unique_state
from node.run.setup import RunSetup
from node.run.trainer import LMTrainer, MinerSpec, RLTrainer, Trainer
from protocol.identity import Identity
from protocol.state import StateDict
from validator.scoring import BatchFn, Evaluator


class Task(ABC):
    kind: Literal["lm", "rl"]

    def __init__(self, setup: RunSetup) -> None:
        self.setup = setup
        self.spec = MinerSpec.from_manifest(setup.manifest)

    @abstractmethod
    def initial_master(self) -> StateDict:
        """W_0 in FP32."""

    @abstractmethod
    def evaluator(self, device: str = "cpu") -> Evaluator:
        """The validator's scoring model (a fresh one: it loads and perturbs weights), on `device` where
        the task can use one."""

    @abstractmethod
    def batch_fn(self) -> BatchFn:
        """The validator's scoring batches, by seed: the same rule miners draw their assignment by."""

    @abstractmethod
    def trainer(self, identity: Identity, device: str = "cpu") -> Trainer:
        """A miner's local work."""


class LMTask(Task):
    """Next-token prediction on the run's corpus; held-out loss is the measure."""

    kind = "lm"

    def initial_master(self) -> StateDict:
        return {n: t.detach().clone().float() for n, t in unique_state(self.setup.new_model()).items()}

    def evaluator(self, device: str = "cpu") -> GPTEvaluator:
        return GPTEvaluator(self.setup.new_model(initial=False).to(device))  # it loads W before every loss

    def batch_fn(self) -> BatchFn:
        return self.setup.eval_batch

    def batches(self, seed: int) -> Batch:
        """A miner's training batch of `seed` (the batch source)."""
        return self.setup.batch(seed)

    def held_out(self) -> list[Batch]:
        return self.setup.held_out()

    def trainer(self, identity: Identity, device: str = "cpu") -> LMTrainer:
        m = self.setup.manifest
        # BF16 autocast only where the manifest asks for it and the device has it (CUDA)
        autocast = m.model.precision == "bf16-autocast" and torch.device(device).type == "cuda"
        model = self.setup.new_model(initial=False).to(device)  # W_r is loaded before every round
        return LMTrainer(self.spec, model, identity, self.batches, device=device, autocast=autocast)


class RLTask(Task):
    """GRPO on verifiable rollouts; the validator scores on the round's rollout pool (`pool`)."""

    kind = "rl"

    def __init__(self, setup: RunSetup) -> None:
        super().__init__(setup)
        self.cfg: RLConfig = setup.manifest.rl
        # the round's checked rollout pool, as the validator's batch function; the validator's
        # round hooks `set` it every round before scoring
        self.pool = PoolSource(setup.manifest.model.gpt.block_size, groups_per_seed=self.cfg.groups_per_batch)

    def initial_master(self) -> StateDict:
        """The (cached) supervised warm start on task examples."""
        m = self.setup.manifest
        return warm_start(m.model.gpt, m.model.seed, m.rl)

    def reference(self) -> StateDict | None:
        """The KL term's reference policy: W_0 (cached on disk, so cheap after once), if the run has one."""
        return self.initial_master() if self.cfg.kl_coef > 0 else None

    def evaluator(self, device: str = "cpu") -> GRPOEvaluator:
        return GRPOEvaluator(self.setup.new_model(), self.cfg, self.reference())  # on the CPU: small models

    def batch_fn(self) -> BatchFn:
        return self.pool  # seed -> rollout tensors, what GRPOEvaluator scores

    def held_out_prompts(self) -> list[bytes]:
        return held_out_prompts(self.cfg)

    def trainer(self, identity: Identity, device: str = "cpu") -> RLTrainer:
        model = self.setup.new_model().to(device)
        return RLTrainer(self.spec, model, identity, self.cfg, self.reference())


def task_for(setup: RunSetup) -> Task:
    """The manifest's task (`task = "lm"` or `"rl"`)."""
    return {"lm": LMTask, "rl": RLTask}[setup.manifest.task](setup)
