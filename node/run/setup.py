"""What a manifest means in memory: the model and the batches (W_0 and the rest of the task: `task.py`).

setup = RunSetup.from_manifest(manifest)
setup.new_model()            # the run's model with W_0 (embedded GPT, or Hugging Face: pretrained or seeded), FP32
setup.new_model(initial=False)  # the same architecture, zero weights: for a node that loads a state first
setup.parameter_count()      # without building the model
setup.batch(seed)            # a miner's training batch, named by its seed
setup.eval_batch(seed)       # the validator's scoring batch of the same seed (a prefix)
setup.held_out()             # the batches the validator reports the loss on
setup.corpus                 # the run's tokens (the user's files go through the token cache once), checked

The corpus is checked when first used: enough held-out tokens for one sequence, and, where the
manifest pins `data.digest`, the same tokens as every other node of the run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from node.learn.basecache import default_cache_dir
from node.learn.data import Corpus, stdlib_corpus
from node.learn.datafiles import resolve
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
    tokenizer_files,
)
from node.learn.model import CausalLM, build_gpt, count_parameters
from node.learn.tokencache import CacheSpec, Tokens, open_or_build
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
        (ids 0-255 of its vocabulary) when there are no tokenizer files. Checked (`check_corpus`)."""
        corpus = self._tokens()
        self.check_corpus(corpus)
        return corpus

    def _tokens(self) -> Corpus:
        m, data = self.manifest.model, self.manifest.data
        tokenizer = load_hf_tokenizer(m.path or "") if m.kind == "hf" and self.hf_tokenizer_files else None
        if m.kind == "hf" and tokenizer is None:
            where = m.path or f"architecture {m.architecture!r}"
            log.warning("no tokenizer files for %s: tokens are bytes (ids 0-255 of the model's vocabulary)", where)
        if data.kind == "embedded":
            text = stdlib_corpus(data.cap_bytes, data.held_out_percent)
            return text if tokenizer is None else tokenize_corpus(text, tokenizer)
        spec = CacheSpec(resolve(data.paths, data.format), data.field, data.held_out_percent, data.cap_bytes)
        tokens = Tokens.bytes() if tokenizer is None else Tokens.of(tokenizer, tokenizer_files(m.path or ""))
        return open_or_build(spec, tokens, default_cache_dir() / "tokens")

    def check_corpus(self, corpus: Corpus) -> None:
        """`ConfigError` (one line: what and what to do) when a split cannot give one sequence, or the
        tokens are not the ones the manifest's `data.digest` names."""
        data = self.manifest.data
        where = "the embedded corpus" if data.kind == "embedded" else ", ".join(data.paths)
        for name, split in (("held-out", corpus.held_out), ("train", corpus.train)):
            if len(split) <= data.seq_len + 1:
                raise ConfigError(
                    f"data: the {name} split of {where} has {len(split)} tokens, fewer than one sequence of "
                    f"data.seq_len + 1 = {data.seq_len + 1}: add text (about {data.held_out_percent}% of the "
                    "documents are held out), raise data.held_out_percent, or lower data.seq_len"
                )
        digest = corpus.digest()
        log.info("data: %d train and %d held-out tokens, digest %s", len(corpus.train), len(corpus.held_out), digest)
        if data.kind == "files" and data.digest is None:
            log.warning(
                "data.digest is not set: nodes cannot check that they train on the same tokens; pin them with "
                'digest = "%s" in [data] (every node of the run needs the same manifest)',
                digest,
            )
        if data.digest is not None and digest != data.digest:
            raise ConfigError(
                f"data.digest: the tokens of {where} here hash to {digest}, the run's are {data.digest}: this "
                "node's data files or tokenizer differ from the validator's; get the same files and model directory"
            )

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
