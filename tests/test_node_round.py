"""In-process pieces of the round protocol: checkpoints, the demo summary, the manifest-derived setup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from node.events import Events, read_events
from node.events.models import Baseline, Done, Exited, Final, PatchApplied, RoundClosed, Started, Submitted
from node.learn.train import bf16_state
from node.roles.chainstate import checkpoint_bytes, load_checkpoint
from node.run.manifest import Manifest, codec_for
from node.run.setup import RunSetup
from node.run.task import task_for
from node.swarm.demo import summarize
from protocol.errors import ConfigError, MalformedPayload, StateHashMismatch
from protocol.identity import Identity
from protocol.state import State
from protocol.statehash import state_hash


def _weights() -> dict[str, torch.Tensor]:
    return {"a": torch.randn(4, 3).bfloat16(), "b": torch.randn(5).bfloat16()}


def test_checkpoint_round_trip_is_hash_checked() -> None:
    weights = _weights()
    data = checkpoint_bytes(weights)
    loaded = load_checkpoint(data, state_hash(weights))
    assert state_hash(loaded) == state_hash(weights)
    with pytest.raises(StateHashMismatch):
        load_checkpoint(data, "0" * 64)
    with pytest.raises(MalformedPayload):
        load_checkpoint(data[:-3], state_hash(weights))
    with pytest.raises(MalformedPayload):
        load_checkpoint(checkpoint_bytes({"a": torch.zeros(2)}), state_hash({"a": torch.zeros(2)}))


def test_setup_from_the_tiny_manifest() -> None:
    setup = RunSetup.from_manifest(Manifest(name="t"))
    model = setup.new_model()
    assert state_hash(bf16_state(model)) == state_hash(bf16_state(setup.new_model()))  # the same W_0 everywhere
    x, _y = setup.batch(7)
    assert x.shape == (setup.manifest.data.batch_size, setup.manifest.data.seq_len)
    with pytest.raises(ConfigError):
        RunSetup.from_manifest(Manifest.model_validate({"name": "t", "model": {"kind": "hf", "path": "/x"}}))


def test_summary_of_events(tmp_path: Path) -> None:
    h = "ab" * 32
    m0, m1 = "cd" * 32, "ef" * 32
    closed = RoundClosed(
        round=0, submissions=2, selected=2, bytes=10, dense_bytes=1000, patch_bytes=20, state_bytes=500, loss=4.0,
        changed_fraction=0.01, scores={m0: 0.1, m1: 0.3}, rejections={}, state_hash=h, seconds=0.2,
        decide_seconds=0.1,
    )  # fmt: skip
    second = closed.model_copy(update={"round": 1, "loss": 3.0, "scores": {m0: 0.2}, "seconds": 0.4})
    validator, miner = Events("validator", tmp_path / "validator.jsonl"), Events("miner", tmp_path / "miner0.jsonl")
    validator.emit(Baseline(loss=5.0), "baseline")
    validator.emit(closed, "round 0")
    validator.emit(second, "round 1")
    miner.emit(Started(sender=m0), "start")
    miner.emit(Submitted(round=0, bytes=9, loss=4.0, busy_fraction=1.0, step_seconds=0.5, compress_seconds=2.0), "sub")
    miner.emit(PatchApplied(round=0, patch_bytes=20, state_hash=h, seconds=0.25), "patch")
    validator.emit(Done(round=1, state_hash=h), "done")
    miner.emit(Final(round=1, state_hash=h, busy_fraction=0.5), "final")
    miner.emit(Exited(peak_rss_mb=300.0), "exit")
    s = summarize(read_events(tmp_path), 2)
    assert s["rounds"] == 2 and s["hashes_agree"] and s["bytes_ratio_vs_dense"] == 100.0
    assert (s["loss_first"], s["loss_last"], s["miner_busy_fraction"]) == (5.0, 3.0, 0.5)
    assert s["peak_rss_mb"] == {"miner": 300.0}
    # each role's mean seconds per phase, from the phases its events report
    assert s["role_seconds"] == {
        "miner": {"step": 0.5, "compress": 2.0, "apply_patch": 0.25},
        "validator": {"decide": 0.1, "round": pytest.approx(0.3)},
    }
    # the leaderboard over rounds: places among the aggregated, named where the key is known
    assert s["places_per_round"] == {"efefefef": [1, None], "miner0": [2, 1]}


def test_trainer_submission_decodes() -> None:
    manifest = Manifest.model_validate({"name": "t", "train": {"inner_steps": 2}})
    setup = RunSetup.from_manifest(manifest)
    trainer = task_for(setup).trainer(Identity.generate())
    weights = bf16_state(setup.new_model())
    delta = trainer.train(0, weights)
    header, payload = trainer.package(0, delta, weights, state_hash(weights))
    assert header.payload_size == len(payload) and header.codec == manifest.train.codec
    update = codec_for(manifest).decompress(payload, weights)
    assert set(update) == set(weights) and any(bool(t.abs().sum() > 0) for t in update.values())


@pytest.mark.parametrize(("error_feedback", "pseudo_gradient"), [("fp32", "fp32"), ("bf16", "fp32"), ("bf16", "bf16")])
def test_a_handed_over_pseudo_gradient_gives_the_same_payload_and_buffer(
    error_feedback: str, pseudo_gradient: str
) -> None:
    """The miner hands its pseudo-gradient to the codec (freed tensor by tensor): the same bytes and
    the same error buffer as a trainer that keeps its copy, both stored as `train.memory` says."""
    memory = {"error_feedback": error_feedback, "pseudo_gradient": pseudo_gradient}
    train = {"inner_steps": 2, "codec": "pulseloco", "memory": memory}
    setup = RunSetup.from_manifest(Manifest.model_validate({"name": "t", "train": train}))
    identity = Identity.generate()
    keeping, handing = task_for(setup).trainer(identity), task_for(setup).trainer(identity)
    weights = bf16_state(setup.new_model())
    for r in range(2):  # the second round carries the first one's buffer
        delta = keeping.train(r, weights)
        assert {t.dtype for t in delta.values()} == {setup.manifest.train.memory.delta_dtype}
        given = {n: t.clone() for n, t in delta.items()}
        kept = keeping.package(r, delta, weights, state_hash(weights))
        handed = handing.package(r, given, weights, state_hash(weights), handover=True)
        assert handed == kept and delta and not given  # the handed dict was emptied, the kept one not
        assert keeping.error is not None and handing.error is not None
        assert all(torch.equal(keeping.error[n], handing.error[n]) for n in keeping.error)
        assert {t.dtype for t in handing.error.values()} == {setup.manifest.train.memory.error_dtype}


def test_a_bf16_buffer_reaches_the_codec_as_stored() -> None:
    """The stored BF16 buffer is handed to the codec as it is (widened tensor by tensor as the codec
    reads it), never converted whole to FP32 first, which would cost 4 bytes a parameter at once."""
    train = {"inner_steps": 2, "codec": "pulseloco", "memory": {"error_feedback": "bf16"}}
    setup = RunSetup.from_manifest(Manifest.model_validate({"name": "t", "train": train}))
    trainer = task_for(setup).trainer(Identity.generate())
    weights = bf16_state(setup.new_model())
    trainer.package(0, trainer.train(0, weights), weights, state_hash(weights))
    seen: list[set[torch.dtype]] = []
    compress = trainer.codec.compress

    def spy(delta: State, error: State | None, *args: Any, **kw: Any) -> Any:
        seen.append({t.dtype for t in (error or {}).values()})
        return compress(delta, error, *args, **kw)

    trainer.codec.compress = spy  # type: ignore[method-assign]
    trainer.package(1, trainer.train(1, weights), weights, state_hash(weights))
    assert seen == [{torch.bfloat16}]
