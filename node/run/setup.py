"""What a manifest means in memory: the model and the batches (W_0 and the rest of the task: `task.py`).

setup = RunSetup.from_manifest(manifest)
setup.new_model()            # the run's model (embedded GPT or local Hugging Face LM), FP32
setup.batch(seed)            # a miner's training batch, named by its seed
setup.eval_batch(seed)       # the validator's scoring batch of the same seed (a prefix)
setup.held_out()             # the batches the validator reports the loss on
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from node.learn.data import Corpus, load_text_files, stdlib_corpus
from node.learn.hfmodel import load_hf_model, load_hf_tokenizer, model_dir, tokenize_corpus
from node.learn.model import CausalLM, build_gpt
from node.learn.train import Batch
from node.run.manifest import Manifest
from protocol.errors import ConfigError

HELD_OUT_SEED = 1_000_003
HELD_OUT_BATCH_SIZE = 16


@dataclass(frozen=True)
class RunSetup:
    manifest: Manifest

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> RunSetup:
        if manifest.model.kind == "hf":
            model_dir(manifest.model.path or "")  # fail now, naming the field, if the files are missing
        return cls(manifest)

    @property
    def run_id(self) -> str:
        return self.manifest.run_id

    @cached_property
    def corpus(self) -> Corpus:
        """Token ids: bytes for the embedded GPT, the model's own tokenizer for kind 'hf'."""
        if self.manifest.model.kind == "hf":
            return tokenize_corpus(self._text(), load_hf_tokenizer(self.manifest.model.path or ""))
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

    def new_model(self) -> CausalLM:
        if self.manifest.model.kind == "hf":
            return load_hf_model(self.manifest.model.path or "")
        return build_gpt(self.manifest.model.gpt, self.manifest.model.seed)

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
        return sum(p.numel() for p in self.new_model().parameters()) * 4
