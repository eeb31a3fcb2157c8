"""Run manifests: the TOML file that names a run, validated by pydantic at load.

A manifest fixes everything the nodes of one run must agree on: the model and its initial
weights, the data, the inner and outer optimizers, the codec, the round deadline, the
Gauntlet's selection settings and the validator keys. Its canonical JSON (sorted keys, no
whitespace) hashes to the run id, which enters every signature: two nodes with different
manifests never accept each other's messages.

    manifest = load_manifest(Path("configs/tiny.toml"))
    manifest.run_id          # 64 hex
    manifest.gauntlet()      # the validator library's settings
    codec_for(manifest)      # the run's codec, with its options

Unknown keys and bad values fail at load with the field named (`ConfigError`).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Annotated, Literal, Self

import tomli_w
from pydantic import BaseModel, Field, StringConstraints, ValidationError, model_validator

from node.learn.hfmodel import ARCHITECTURES
from node.learn.model import GPTConfig
from node.learn.rl.config import RLConfig
from node.learn.train import InnerOptimConfig, MemoryConfig
from protocol.codec import Codec
from protocol.codec_options import build_codec
from protocol.errors import ConfigError
from protocol.parsing import STRICT, one_line
from validator.config import GauntletConfig, SelectionRules, UpdateRules

PublicKeyHex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class ModelSection(BaseModel):
    """Which model the run trains and how its initial weights are made."""

    model_config = STRICT

    kind: Literal["gpt", "hf"] = "gpt"
    """'gpt': the embedded byte-level GPT; 'hf': a Hugging Face causal LM (see `init`)."""
    gpt: GPTConfig = GPTConfig()
    """Sizes of the embedded GPT (kind 'gpt')."""
    seed: int = Field(default=0, ge=0)
    """Seed of the initial weights W_0: the embedded GPT's, or a seeded 'hf' model's (`init = "seeded"`)."""
    init: Literal["pretrained", "seeded"] = "pretrained"
    """Kind 'hf': 'pretrained' loads the weights under `path`; 'seeded' builds the architecture of
    `path`'s config.json (no weights file needed) or of `architecture`, with weights drawn from
    `seed`: a pre-training run from scratch. (The embedded GPT is always seeded.)"""
    path: str | None = None
    """Local directory of the Hugging Face model (kind 'hf'): config.json, the weights unless seeded,
    and the tokenizer files if any (without them tokens are bytes). The same files on every node."""
    architecture: str | None = None
    """Kind 'hf', seeded: a built-in architecture instead of `path` (one of `hfmodel.ARCHITECTURES`,
    e.g. 'qwen2.5-0.5b'); nothing on disk, tokens are bytes."""
    precision: Literal["fp32", "bf16-autocast"] = "fp32"
    """Inner-step arithmetic: plain FP32, or BF16 autocast on CUDA (weights stay FP32 masters)."""

    @model_validator(mode="after")
    def _source(self) -> Self:
        if self.kind == "gpt":
            if self.architecture is not None or self.init != "pretrained":
                raise ValueError("`architecture` and `init` are for kind 'hf' (the embedded GPT is always seeded)")
            return self
        if self.architecture is not None:
            if self.architecture not in ARCHITECTURES:
                raise ValueError(f"architecture {self.architecture!r} is not one of {sorted(ARCHITECTURES)}")
            if self.path is not None or self.init != "seeded":
                raise ValueError("a built-in `architecture` needs init = 'seeded' and no `path`")
        elif not self.path:
            raise ValueError("a model of kind 'hf' needs `path` (a local model directory) or `architecture`")
        return self


class DataSection(BaseModel):
    """Where training and evaluation batches come from (`node/learn/datafiles.py`, `tokencache.py`)."""

    model_config = STRICT

    kind: Literal["embedded", "files"] = "embedded"
    """'embedded': the Python standard library's sources, as bytes; 'files': your own text, JSONL or
    Parquet files, tokenized once with the model directory's tokenizer into a memory-mapped cache."""
    paths: list[str] = Field(default_factory=list, max_length=10_000)
    """Kind 'files': files, folders (every file under them) or globs, read in this order."""
    format: Literal["auto", "text", "jsonl", "parquet"] = "auto"
    """Kind 'files': 'auto' goes by each file's suffix (.jsonl/.json/.ndjson, .parquet; anything else
    is text); or one format for every file."""
    field: Annotated[str, StringConstraints(min_length=1, max_length=128)] = "text"
    """Kind 'files': the JSONL field / Parquet column that holds each document's text."""
    held_out_percent: int = Field(default=5, ge=1, le=50)
    """Share of documents held out for the validator's loss report, chosen by a hash of each
    document (of each file's path for the embedded corpus): the same split on every node."""
    digest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    """SHA-256 of the run's tokens (both splits; `pulse doctor` and every node's log print it): with
    it set, a node whose files or tokenizer give other tokens refuses to start, naming both digests."""
    cap_bytes: int = Field(default=4 * 2**20, ge=4096)
    """Bytes of text read at most (train and held-out together)."""
    batch_size: int = Field(default=8, ge=1, le=4096)
    """Sequences per inner step."""
    seq_len: int = Field(default=64, ge=8)
    """Tokens per sequence; at most the model's context length."""

    @model_validator(mode="after")
    def _paths_for_files(self) -> Self:
        if self.kind == "files" and not self.paths:
            raise ValueError("data of kind 'files' needs `paths`")
        return self


class TrainSection(UpdateRules):
    """The miners' inner loop (DiLoCo: H local AdamW steps per round), and how its result reaches
    the master: the codec, its options and the outer step (`validator.config.UpdateRules`)."""

    model_config = STRICT

    inner_steps: int = Field(default=10, ge=1, le=100_000)
    """H: inner steps a miner trains per round."""
    inner: InnerOptimConfig = InnerOptimConfig(lr=1e-3)
    """Inner AdamW settings."""
    memory: MemoryConfig = MemoryConfig()
    """What the inner loop keeps in memory: AdamW moments, activations, the error-feedback buffer
    (`pulse bench memory` compares the choices)."""
    overlap: bool = True
    """Miners train round r+1 from W_r while round r is scored, and submit that one-round-stale
    pseudo-gradient for r+1 (as in overlapped / streaming DiLoCo), so they do not sit idle."""
    fill_steps: int = Field(default=0, ge=0, le=100_000)
    """With `overlap`: a miner whose H steps for round r+1 end before it holds W_{r+1} goes on
    training on its assignment, up to this many more steps, until it does (0: H steps only). Its
    device then works while the validator scores instead of waiting; a faster miner sends an update
    of more steps."""

    @model_validator(mode="after")
    def _memory_fits_optimizer(self) -> Self:
        self.memory.check_betas(self.inner)
        return self


class RoundSection(BaseModel):
    """Round timing and checkpoints."""

    model_config = STRICT

    deadline_seconds: float = Field(default=60.0, gt=0, le=86_400)
    """Longest a round stays open for submissions; a miner that misses it is recorded as missing."""
    min_seconds: float = Field(default=0.0, ge=0)
    """Shortest a round stays open, even when every recent miner has already submitted."""
    deadline_mode: Literal["fixed", "adaptive"] = "fixed"
    """'fixed': a round waits for every active miner up to `deadline_seconds`; 'adaptive': it also
    closes once `quorum` of them have submitted and a target learned from the arrival times of
    recent rounds' quorums (`roles/deadline.py`) has passed, never outside [min_seconds, deadline_seconds]."""
    quorum: float = Field(default=0.75, gt=0, le=1)
    """Adaptive: the share of the active miners whose submissions let a round close at its target."""
    margin_mads: float = Field(default=3.0, ge=0, le=100)
    """Adaptive: the target is the quorums' median arrival time plus this many median absolute
    deviations (measured within rounds)."""
    history_rounds: int = Field(default=8, ge=1, le=1000)
    """Adaptive: how many recent rounds' arrival times the target is learned from."""
    checkpoint_every: int = Field(default=5, ge=1, le=10_000)
    """The validator announces a full BF16 checkpoint every this many rounds (and at start-up)."""
    keep_checkpoints: int = Field(default=3, ge=1, le=1000)
    """Every node keeps its newest this many checkpoints whole (the BF16 state, its piece index, the FP32
    master) and the patches since the oldest: an auditor, a standby or a joiner that started from a
    head up to (this - 1) x `checkpoint_every` rounds old still finds what it names."""
    record_ttl_seconds: float = Field(default=6 * 3600.0, gt=0, le=86_400)
    """How long round results, checkpoints and heartbeats live in the DHT."""
    takeover_seconds: float = Field(default=30.0, gt=0, le=86_400)
    """With several validators: a standby closes a round itself once the active validator has published
    no result this long after the round's deadline (the next standby in line waits this long again)."""
    replicate_seconds: float | None = Field(default=None, gt=0, le=86_400)
    """With several validators: how long the active validator waits, before it publishes a round's
    result, for a standby that announced the round to hold the result's patch, evidence and payloads
    (so that it can take over at once should the active one die right after publishing); None: half
    of `takeover_seconds`. With no standby announcing the round it publishes at once."""
    keep_payload_rounds: int | None = Field(default=None, ge=1, le=10_000)
    """Rounds the validator and every auditor keep the aggregated payloads fetchable, so that anyone can
    recompute a round; None: `checkpoint_every` + 1, enough for an auditor that starts at the newest
    FP32 checkpoint."""

    @property
    def replicate_wait(self) -> float:
        return self.replicate_seconds if self.replicate_seconds is not None else self.takeover_seconds / 2

    @property
    def payload_rounds(self) -> int:
        return self.keep_payload_rounds or self.checkpoint_every + 1

    @model_validator(mode="after")
    def _min_within_deadline(self) -> Self:
        if self.min_seconds > self.deadline_seconds:
            raise ValueError("min_seconds must not exceed deadline_seconds")
        return self


class SelectionSection(SelectionRules):
    """The Gauntlet settings a run fixes (`validator.config.SelectionRules`; the validator's other
    thresholds keep `GauntletConfig`'s defaults), and the sizes of its evaluation batches."""

    model_config = STRICT

    eval_batch_size: int = Field(default=8, ge=1, le=4096)
    """Sequences per scoring batch (a prefix of the miners' batch of the same seed)."""
    held_out_batches: int = Field(default=4, ge=0, le=1024)
    """Held-out batches the validator reports the loss on after each round (0: no report)."""


class Manifest(BaseModel):
    """One training run. Its canonical JSON hashes to the run id."""

    model_config = STRICT

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    """Human-readable run name (does not have to be unique; the run id is)."""
    validators: list[PublicKeyHex] = Field(default_factory=list, max_length=16)
    """Ed25519 public keys (hex) whose round results nodes follow; `pulse keygen` prints one."""
    task: Literal["lm", "rl"] = "lm"
    """'lm': language-model training on the corpus; 'rl': GRPO post-training with rollouts from the
    run's inference workers (followers), on the arithmetic task of `[rl]`."""
    model: ModelSection = ModelSection()
    """The model the run trains and how its initial weights W_0 are made."""
    data: DataSection = DataSection()
    """The corpus miners train on and the validator scores on."""
    train: TrainSection = TrainSection()
    """The miners' inner loop, the codec and the outer step."""
    round: RoundSection = RoundSection()
    """Round deadlines, checkpoints and DHT record lifetimes."""
    selection: SelectionSection = SelectionSection()
    """What the Gauntlet fixes for the run: assignments, scoring batches, top G, indicator threshold."""
    rl: RLConfig = RLConfig()
    """The RL task, GRPO and rollout settings (read when `task = "rl"`)."""

    @model_validator(mode="after")
    def _seq_fits(self) -> Self:
        if self.model.kind == "gpt" and self.data.seq_len > self.model.gpt.block_size:
            raise ValueError(f"data.seq_len {self.data.seq_len} exceeds model.gpt.block_size")
        return self

    @model_validator(mode="after")
    def _every_assigned_batch_trained(self) -> Self:
        # the validator scores a miner on a secret sample of its assigned batches: each must be one
        # it trained on (inner step s trains on batch s mod assignment_batches)
        if self.task == "lm" and self.selection.assignment_batches > self.train.inner_steps:
            raise ValueError(
                f"selection.assignment_batches {self.selection.assignment_batches} exceeds train.inner_steps "
                f"{self.train.inner_steps}: a miner would never train on some of its batches"
            )
        return self

    @model_validator(mode="after")
    def _rl_needs_bytes(self) -> Self:
        if self.task == "rl" and self.model.kind != "gpt":
            raise ValueError("task 'rl' runs on the embedded byte-level GPT (model.kind 'gpt')")
        if self.task == "rl" and self.train.overlap:
            # a miner cannot train round r+1 ahead: its rollouts come from the pool the validator
            # publishes when r+1 opens
            raise ValueError("task 'rl' needs train.overlap = false")
        return self

    @property
    def run_id(self) -> str:
        return hashlib.sha256(b"pulse/manifest/v1\x00" + self.canonical_bytes()).hexdigest()

    def canonical_bytes(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()

    def gauntlet(self) -> GauntletConfig:
        """The validator library's settings: what `[train]` and `[selection]` fix, defaults otherwise."""
        return GauntletConfig.for_run(self.train, self.selection, fp32_checkpoint_every=self.round.checkpoint_every)

    def with_validators(self, keys: list[str]) -> Manifest:
        """A copy naming `keys` as the validators (a different run id)."""
        return Manifest.model_validate({**self.model_dump(mode="python"), "validators": keys})

    def to_toml(self) -> str:
        """The manifest as TOML (what `load_manifest` reads back to the same run id): a field set to None
        is left out, as TOML has no null, and reads back as its default."""
        return tomli_w.dumps(self.model_dump(mode="json", exclude_none=True))


def codec_for(manifest: Manifest) -> Codec:
    """The run's pseudo-gradient codec, built with the manifest's options (miners and validators alike)."""
    return build_codec(manifest.train.codec, manifest.train.codec_options)


def parse_manifest(data: dict[str, object], source: str = "manifest") -> Manifest:
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {one_line(exc, 'manifest')}") from exc


def load_manifest(path: Path) -> Manifest:
    """Read and validate a TOML manifest; `ConfigError` names the file and the bad field."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return parse_manifest(data, str(path))
