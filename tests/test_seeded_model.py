"""A Hugging Face model from its architecture alone: a config.json (or a built-in name), seeded
weights, byte ids without tokenizer files; the same manifest checks and run-id rules as the rest."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from node.learn.hfmodel import build_hf_from_config, count_hf_parameters, hf_skeleton
from node.learn.train import bf16_state, unique_state
from node.run.manifest import parse_manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.errors import ConfigError
from protocol.identity import Identity
from protocol.statehash import state_hash

pytest.importorskip("transformers")

from tests.models import TINY_QWEN


def _config_dir(root: Path, config: dict[str, Any] = TINY_QWEN) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    return root


def _manifest(model: dict[str, Any], **train: Any) -> Any:
    return parse_manifest(
        {
            "name": "seeded",
            "model": {"kind": "hf", "init": "seeded", **model},
            "data": {"batch_size": 2, "seq_len": 16},
            "train": {"inner_steps": 2, "codec": "pulseloco", "inner": {"lr": 1e-3}, **train},
        }
    )


def test_a_config_json_alone_gives_a_seeded_model_on_byte_ids(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    setup = RunSetup.from_manifest(_manifest({"path": str(_config_dir(tmp_path / "m")), "seed": 3}))
    with caplog.at_level(logging.WARNING):
        x, y = setup.batch(7)
    assert "tokens are bytes" in caplog.text
    assert x.shape == (2, 16) and int(x.max()) < 256  # byte ids of a 300-id vocabulary
    w0 = bf16_state(setup.new_model())
    assert state_hash(w0) == state_hash(bf16_state(setup.new_model()))  # W_0 is a function of the manifest
    assert setup.parameter_count() == sum(t.numel() for t in w0.values()) == count_hf_parameters(TINY_QWEN)
    other = RunSetup.from_manifest(_manifest({"path": str(tmp_path / "m"), "seed": 4}))
    assert state_hash(bf16_state(other.new_model())) != state_hash(w0)
    skeleton = unique_state(setup.new_model(initial=False))
    assert set(skeleton) == set(w0) and all(float(t.abs().max()) == 0 for t in skeleton.values())
    with torch.no_grad():
        loss = setup.new_model().loss(x, y)
    assert math.isfinite(float(loss)) and abs(float(loss) - math.log(300)) < 0.5  # seeded: near uniform


def test_seeded_init_follows_the_rule_and_ties_once() -> None:
    model = build_hf_from_config(TINY_QWEN, seed=1)
    state = model.state_dict()
    emb = state["lm.model.embed_tokens.weight"]
    assert abs(float(emb.std()) - 0.02) < 0.002 and model.lm.lm_head.weight is model.lm.model.embed_tokens.weight
    assert float(state["lm.model.layers.0.self_attn.q_proj.bias"].abs().max()) == 0
    assert torch.equal(state["lm.model.norm.weight"], torch.ones(32))
    rotary = dict(model.named_buffers())["lm.model.rotary_emb.inv_freq"]
    assert torch.isfinite(rotary).all() and float(rotary[0]) == 1.0  # buffers are real, not skipped init
    assert hf_skeleton(TINY_QWEN).lm.lm_head.weight is not None


def test_the_built_in_architecture_is_checked_without_building_it() -> None:
    manifest = _manifest({"architecture": "qwen2.5-0.5b"})
    assert RunSetup.from_manifest(manifest).parameter_count() == 494_032_768
    assert manifest.run_id != _manifest({"architecture": "qwen2.5-1.5b"}).run_id


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ({"architecture": "qwen9"}, "not one of"),
        ({"architecture": "qwen2.5-0.5b", "path": "/x"}, "no `path`"),
        ({"architecture": "qwen2.5-0.5b", "init": "pretrained"}, "init = 'seeded'"),
        ({}, "needs `path`"),
        ({"kind": "gpt"}, "for kind 'hf'"),
    ],
)
def test_bad_model_sections_fail_naming_the_field(model: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _manifest(model)


def test_a_missing_config_or_a_vocabulary_too_small_for_bytes_fails_at_setup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.path"):
        RunSetup.from_manifest(_manifest({"path": str(tmp_path / "none")}))
    small = _config_dir(tmp_path / "small", {**TINY_QWEN, "vocab_size": 100})
    with pytest.raises(ConfigError, match="byte ids"):
        RunSetup.from_manifest(_manifest({"path": str(small)}))


def test_a_miner_trains_the_seeded_model_with_the_memory_options(tmp_path: Path) -> None:
    memory = {"moments": "bf16", "checkpointing": True, "error_feedback": "bf16"}
    setup = RunSetup.from_manifest(_manifest({"path": str(_config_dir(tmp_path / "m"))}, memory=memory))
    weights = bf16_state(setup.new_model())
    trainer = task_for(setup).trainer(Identity.generate())
    delta = trainer.train(0, weights)
    assert math.isfinite(trainer.last_loss) and any(float(d.abs().max()) > 0 for d in delta.values())
    assert all(p.grad is None for p in trainer.model.parameters())  # freed before the codec runs
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and all(m.dtype == torch.bfloat16 for m in moments)
    header, payload = trainer.package(0, delta, weights, state_hash(weights))
    assert header.payload_size == len(payload) > 0
    assert trainer.error is not None and all(e.dtype == torch.bfloat16 for e in trainer.error.values())
    trainer.package(1, trainer.train(1, weights), weights, state_hash(weights))  # a BF16 buffer is carried on
