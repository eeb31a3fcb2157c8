"""A miner's local work in a round: H inner steps from W_r, then the run's codec with error feedback.

    trainer = task.trainer(identity)                        # an LMTrainer or an RLTrainer
    delta = trainer.train(r, weights)                       # W_r - W_local after H steps (FP32 or BF16: train.memory)
    header, payload = trainer.package(r, delta, weights, base_hash, fraction)   # fraction: of the codec's values

The one implementation of the honest miner's step: the `pulse miner` role, the benchmarks' fake
miners (`node/swarm/fakeminers.py`) and the RL simulation (`node/bench/rlsim.py`) all train
through these classes. A trainer holds its model, its optimizer and one error-feedback buffer;
nothing grows with the number of peers. What differs per task is only `train`:

- `LMTrainer`: AdamW on the miner's assigned batches (`Assignment.step_seed`), as DiLoCo;
- `RLTrainer`: GRPO on the rollout groups its assignment seeds draw from the round's pool
  (`use_pool` hands it the pool, which the network side of the miner fetched).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from node.learn.model import CausalLM
from node.learn.rl.config import RLConfig
from node.learn.rl.evaluator import PoolSource
from node.learn.rl.grpo import GRPOTrainer
from node.learn.train import (
    Batch,
    InnerOptimConfig,
    MemoryConfig,
    apply_memory,
    autocast,
    inner_train,
    load_bf16_state,
    make_optimizer,
    pseudo_gradient,
)
from node.run.manifest import Manifest
from protocol.assignment import Assignment
from protocol.codec import CodecStats
from protocol.codec_options import CodecOptions, build_codec
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.rollouts import RolloutGroup
from protocol.state import State, StateDict


@dataclass(frozen=True)
class MinerSpec:
    """What every miner of a run agrees on: from a manifest, or from a benchmark's own settings."""

    run_id: str
    codec: str
    inner: InnerOptimConfig
    steps: int  # H inner steps per round
    assignment_batches: int
    codec_options: CodecOptions = field(default_factory=CodecOptions)
    memory: MemoryConfig = field(default_factory=MemoryConfig)  # what the inner loop keeps (train.memory)
    fill_steps: int = 0  # at most this many steps past H while `train`'s `until` says to go on (train.fill_steps)

    @classmethod
    def from_manifest(cls, m: Manifest) -> MinerSpec:
        return cls(
            run_id=m.run_id,
            codec=m.train.codec,
            inner=m.train.inner,
            steps=m.train.inner_steps,
            assignment_batches=m.selection.assignment_batches,
            codec_options=m.train.codec_options,
            memory=m.train.memory,
            fill_steps=m.train.fill_steps if m.train.overlap else 0,
        )


class Stopped(Exception):
    """The node is stopping (`Trainer.stopping` was set): training ended between two inner steps."""


class Trainer(ABC):
    """H inner steps from W_r (`train`, per task), compressed with error feedback, in a signed-ready header."""

    def __init__(self, spec: MinerSpec, model: CausalLM, identity: Identity) -> None:
        self.spec, self.model, self.identity = spec, model, identity
        # set from another thread (a miner stopping on Ctrl+C): `train` raises `Stopped` after the step
        # it is in, so a node exits in one step's time, not after the rest of a round of training
        self.stopping = threading.Event()
        self.codec = build_codec(spec.codec, spec.codec_options)
        self.error: StateDict | None = None
        self.steps_done = 0
        self.last_steps = 0  # inner steps of the last round (H, or more with `fill_steps`)
        self.last_loss = float("nan")  # mean loss of the last round's inner steps
        self.last_stats: CodecStats | None = None  # of the last compression

    @abstractmethod
    def train(self, round_: int, weights: State, until: Callable[[], bool] | None = None) -> State:
        """Pseudo-gradient W - W_local after H steps from the BF16 `weights` of round `round_` (LM: stored
        as `train.memory.pseudo_gradient` says); then, with `until`, up to `fill_steps` more while
        `until()` is False (language modelling; a task without it trains H)."""

    def _check_stopping(self, *_: object) -> None:
        """Raise `Stopped` once `stopping` is set (an inner-step hook)."""
        if self.stopping.is_set():
            raise Stopped("training stopped: the node is stopping")

    def assignment(self, round_: int, miner: str | None = None) -> Assignment:
        """The data assignment of `miner` (default: this one) in `round_`."""
        return Assignment(self.spec.run_id, round_, miner or self.identity.public_hex, self.spec.assignment_batches)

    def compress(self, delta: State, weights: State, fraction: float = 1.0, *, handover: bool = False) -> bytes:
        """`delta` plus the error buffer, compressed against the BF16 `weights`; the buffer keeps the rest
        (stored as `train.memory.error_feedback` says; the codec works on it in FP32). `fraction` < 1
        sends that share of the codec's values (a slow uplink; `roles/uplink.py`).

        The old buffer is handed to the codec and `delta` too with `handover` (a dict the caller gives
        up): each tensor is freed once the codec has read it, so a miner's host holds the pseudo-gradient,
        the old buffer and the new one whole only for the tensor in hand (`Codec.compress`). Should the
        codec refuse the update (NaN), the buffer starts afresh next round."""
        old, self.error = self.error, None  # handed over as stored: the codec widens a BF16 tensor when it reads it
        given = delta if handover and isinstance(delta, dict) else dict(delta)  # a copy frees nothing of the caller's
        payload, self.error, self.last_stats = self.codec.compress(
            given, old, weights, fraction=fraction, handover=True, error_dtype=self.spec.memory.error_dtype
        )  # the new buffer comes stored as train.memory says, each tensor narrowed once the codec is done with it
        return payload

    def header(self, round_: int, payload: bytes, base_hash: str, digest: str | None = None) -> SubmissionHeader:
        """The header this miner signs for `payload` (`digest`: of its own assignment unless given)."""
        return SubmissionHeader.for_payload(
            run_id=self.spec.run_id,
            round_=round_,
            base_hash=base_hash,
            payload=payload,
            codec=self.spec.codec,
            data_digest=digest or self.assignment(round_).digest,
            sender=self.identity.public_hex,
        )

    def package(
        self,
        round_: int,
        delta: State,
        weights: State,
        base_hash: str,
        fraction: float = 1.0,
        *,
        handover: bool = False,
    ) -> tuple[SubmissionHeader, bytes]:
        """The signed-ready header and the payload of `delta` (`compress`; `handover`: `delta` is given up)."""
        payload = self.compress(delta, weights, fraction, handover=handover)
        return self.header(round_, payload, base_hash), payload

    def _delta(self, weights: State) -> StateDict:
        """W - W_local, stored on the host as `train.memory.pseudo_gradient` says."""
        return pseudo_gradient(weights, self.model, self.spec.memory.delta_dtype)


class LMTrainer(Trainer):
    """AdamW on the miner's assigned batches (`batch`: seed -> batch, the run's training batches)."""

    def __init__(
        self,
        spec: MinerSpec,
        model: CausalLM,
        identity: Identity,
        batch: Callable[[int], Batch],
        *,
        device: str = "cpu",
        autocast: bool = False,
    ) -> None:
        super().__init__(spec, model, identity)
        self.batch, self.device, self.autocast = batch, torch.device(device), autocast
        apply_memory(model, spec.memory)
        self.optimizer = make_optimizer(model, spec.inner, spec.memory)

    def train(self, round_: int, weights: State, until: Callable[[], bool] | None = None) -> State:
        return self.train_on(self.assignment(round_), weights, until)

    def train_on(self, assignment: Assignment, weights: State, until: Callable[[], bool] | None = None) -> State:
        """H steps from `weights` on `assignment`'s batches (a thief trains on another miner's), then
        one more at a time, cycling over the same batches, while `until()` is False (`fill_steps` at most)."""
        load_bf16_state(self.model, weights)
        first, spec = self.steps_done, self.spec

        def batch(step: int) -> Batch:
            x, y = self.batch(assignment.step_seed(step - first))
            return x.to(self.device), y.to(self.device)

        check = self._check_stopping
        check()
        with autocast(self.device, self.autocast, spec.memory):
            losses = inner_train(
                self.model, spec.inner, batch, spec.steps, optimizer=self.optimizer, first_step=first, on_step=check
            )
            while until is not None and len(losses) < spec.steps + spec.fill_steps and not until():
                losses += inner_train(
                    self.model, spec.inner, batch, 1, optimizer=self.optimizer, first_step=first + len(losses),
                    on_step=check,
                )  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)  # free the gradients before the delta and the codec run
        self.steps_done += len(losses)
        self.last_steps = len(losses)
        self.last_loss = sum(losses) / len(losses)
        return self._delta(weights)


class RLTrainer(Trainer):
    """GRPO on the rollout groups this miner's assignment seeds draw from the round's pool.

    Minibatch j of a round is the `groups_per_batch` groups [j*m, (j+1)*m) of its draw (one seed's
    worth), as the validator scores a seed's sample (`PoolSource`).
    """

    def __init__(
        self,
        spec: MinerSpec,
        model: CausalLM,
        identity: Identity,
        cfg: RLConfig,
        reference: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__(spec, model, identity)
        self.cfg = cfg
        self.grpo = GRPOTrainer(model, spec.inner, cfg, reference=reference, minibatch_groups=cfg.groups_per_batch)
        self.rollouts: dict[int, list[RolloutGroup]] = {}  # round -> the groups this miner trains on

    def use_pool(self, round_: int, batches: Sequence[Sequence[RolloutGroup]]) -> None:
        """The round's pool, in the validator's order: keeps the groups this miner's seeds draw."""
        source = PoolSource(groups_per_seed=self.cfg.groups_per_batch)
        source.set(batches)
        self.rollouts = {round_: source.groups(self.assignment(round_).seeds)}

    def has_pool(self, round_: int) -> bool:
        return round_ in self.rollouts

    def train(self, round_: int, weights: State, until: Callable[[], bool] | None = None) -> State:
        groups = self.rollouts.get(round_)
        if not groups:
            raise RuntimeError(f"no rollouts for round {round_}: `use_pool` first")
        self._check_stopping()
        # a pool's groups are drawn for H steps
        delta = self.grpo.train(weights, groups, self.spec.steps, self._check_stopping)
        self.steps_done += self.spec.steps
        self.last_steps = self.spec.steps
        self.last_loss = self.grpo.last_loss
        return delta
