"""What a manifest means in memory: the model and the batches (W_0 and the rest of the task: `task.py`).

setup = RunSetup.from_manifest(manifest)
setup.new_model()            # the run's model with W_0 (embedded GPT, or Hugging Face: pretrained or seeded), FP32
setup.new_model(initial=False)  # the same architecture, zero weights: for a node that loads a state first
setup.parameter_count()      # without building the model
setup.batch(seed)            # a miner's training batch, named by its seed
setup.eval_batch(seed)       # the validator's scoring batch of the same seed (a prefix)
setup.held_out()             # the batches the validator reports the loss on
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from node.learn.data import Corpus, load_text_files, stdlib_corpus
from node.learn.hfmodel import (
    ARCHITECTURES,
    build_hf_from_config,
    count_hf_parameters,
    has_tokenizer,
    hf_skeleton,
    load_hf_model,
    load_hf_tokenizer,
    model_dir,
    read_config,
    tokenize_corpus,
)
from node.learn.model import CausalLM, build_gpt, count_parameters
from node.learn.train import Batch
from node.run.manifest import Manifest
from protocol.errors import ConfigError

HELD_OUT_SEED = 1_000_003
HELD_OUT_BATCH_SIZE = 16
BYTE_VOCAB = 256
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSetup:
    manifest: Manifest

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> RunSetup:
        setup = cls(manifest)
        if manifest.model.kind == "hf":
            # fail now, naming the field, if the files are missing or the vocabulary cannot hold bytes
            if manifest.model.init == "seeded":
                setup.hf_config  # noqa: B018
            else:
                model_dir(manifest.model.path or "")
            vocab = None if setup.hf_tokenizer_files else setup.hf_config.get("vocab_size")
            if isinstance(vocab, int) and vocab < BYTE_VOCAB:
                raise ConfigError(f"model: no tokenizer files, and a vocabulary of {vocab} < {BYTE_VOCAB} byte ids")
        return setup

    @property
    def run_id(self) -> str:
        return self.manifest.run_id

    @cached_property
    def hf_config(self) -> dict[str, Any]:
        """Kind 'hf': the architecture (config.json under `path`, or the built-in `architecture`)."""
        m = self.manifest.model
        return dict(ARCHITECTURES[m.architecture]) if m.architecture else read_config(m.path or "")

    @property
    def hf_tokenizer_files(self) -> bool:
        path = self.manifest.model.path
        return path is not None and has_tokenizer(path)

    @cached_property
    def corpus(self) -> Corpus:
        """Token ids: bytes for the embedded GPT; for kind 'hf' the model's own tokenizer, or bytes
        (ids 0-255 of its vocabulary) when there are no tokenizer files."""
        if self.manifest.model.kind == "hf" and self.hf_tokenizer_files:
            return tokenize_corpus(self._text(), load_hf_tokenizer(self.manifest.model.path or ""))
        if self.manifest.model.kind == "hf":
            where = self.manifest.model.path or f"architecture {self.manifest.model.architecture!r}"
            log.warning("no tokenizer files for %s: tokens are bytes (ids 0-255 of the model's vocabulary)", where)
        return self._text()

    def _text(self) -> Corpus:
        data = self.manifest.data
        if data.kind == "embedded":
            return stdlib_corpus(data.cap_bytes)
        paths = [Path(p).expanduser() for p in data.paths]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise ConfigError(f"data.paths: not a file: {missing[0]}")
        return load_text_files(paths, Path("/"), data.cap_bytes)

    def new_model(self, *, initial: bool = True) -> CausalLM:
        """The run's model in FP32 with W_0; with `initial=False` possibly zero weights instead (for a
        node that loads a state before using it: a seeded or pretrained Hugging Face model is then
        built from its architecture alone, skipping the draws or the weights file)."""
        m = self.manifest.model
        if m.kind == "gpt":
            return build_gpt(m.gpt, m.seed)
        if not initial:
            return hf_skeleton(self.hf_config)
        if m.init == "seeded":
            return build_hf_from_config(self.hf_config, m.seed)
        return load_hf_model(m.path or "")

    def parameter_count(self) -> int:
        """Parameters of the run's model (tied ones once), without building it."""
        if self.manifest.model.kind == "gpt":
            return count_parameters(build_gpt(self.manifest.model.gpt))
        return count_hf_parameters(self.hf_config)

    def batch(self, seed: int) -> Batch:
        data = self.manifest.data
        return self.corpus.batch(seed, data.batch_size, data.seq_len)

    def eval_batch(self, seed: int) -> Batch:
        return self.corpus.batch(seed, self.manifest.selection.eval_batch_size, self.manifest.data.seq_len)

    def held_out(self) -> list[Batch]:
        n, seq = self.manifest.selection.held_out_batches, self.manifest.data.seq_len
        return [self.corpus.batch(HELD_OUT_SEED * (i + 1), HELD_OUT_BATCH_SIZE, seq, "held_out") for i in range(n)]

    def dense_bytes(self) -> int:
        """Bytes of a dense FP32 pseudo-gradient: what a codec's payload is compared with."""
        return self.parameter_count() * 4
