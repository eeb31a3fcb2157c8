"""`pulse export`: a run's model as a Hugging Face folder that `transformers` loads and that computes
pulse's logits, with a ledger that `--verify` checks and that any tampering breaks."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from node.bench.arena import Arena
from node.commands.cli import main
from node.learn.hfexport import byte_tokenizer, from_gpt2, to_gpt2
from node.learn.hfmodel import build_hf_from_config
from node.learn.model import build_gpt
from node.learn.train import bf16_state, load_bf16_state, unique_state
from node.roles.chainstate import checkpoint_bytes
from node.roles.export import from_checkpoint, from_state_dir, verify_export, write_export
from node.run.manifest import Manifest, load_manifest, parse_manifest
from node.run.presets import preset
from node.swarm.fakeminers import identity_for
from protocol.errors import BrokenChain, ConfigError, InvalidSignature, ProtocolError
from protocol.statehash import state_hash
from tests.fakeswarm import TINY, make_swarm
from validator import ledger

transformers = pytest.importorskip("transformers")
ROUNDS = 3


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def tiny_manifest(**model: object) -> Manifest:
    """configs/tiny.toml with the test swarm's GPT and its validator key."""
    data = load_manifest(preset("tiny")).model_dump(mode="json")
    data["validators"] = [identity_for("validator").public_hex]
    data["model"]["gpt"] = TINY.model_dump(mode="json")
    data["model"].update(model)
    return parse_manifest(data)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A validator's state folder after 3 rounds of 2 honest fake miners, on the manifest's run."""
    folder = tmp_path_factory.mktemp("vstate")
    swarm = make_swarm(run_id=tiny_manifest().run_id, min_indicator_average=0.05, keep_rounds=1)
    arena = Arena(swarm.validator(folder / "validator"), swarm.honest(2))
    for _ in range(ROUNDS):
        arena.play()
    assert sum(len(r.report.selected()) for r in arena.records) > 0  # someone was aggregated
    return folder


@pytest.fixture(scope="module")
def exported(state_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "model"
    write_export(from_state_dir(state_dir), tiny_manifest(), out)
    return out


def test_gpt_export_loads_in_transformers_with_pulse_logits(state_dir: Path, exported: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = from_state_dir(state_dir)
    pulse_model = build_gpt(TINY)
    load_bf16_state(pulse_model, source.weights)
    hf, info = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    assert type(hf).__name__ == "GPT2LMHeadModel"
    x = torch.randint(0, 256, (3, TINY.block_size), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = pulse_model(x), hf.eval()(input_ids=x).logits
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-5), (ours - theirs).abs().max()
    assert AutoModelForCausalLM.from_pretrained(exported).dtype == torch.bfloat16  # the weights as trained

    tokenizer = AutoTokenizer.from_pretrained(exported)
    text = "def f(x):\n    return x  # héllo ✓\t\x00"
    ids = tokenizer(text)["input_ids"]
    assert ids == list(text.encode()) and tokenizer.decode(ids) == text


def test_gpt2_mapping_is_exact_both_ways() -> None:
    model = build_gpt(TINY, seed=5)
    with torch.no_grad():  # layer norms away from their (1, 0) initialisation, so a swapped one shows
        for name, p in model.named_parameters():
            if ".ln" in name or name.startswith("ln_f"):
                p.add_(torch.randn_like(p) * 0.1)
    weights = bf16_state(model)
    hf = to_gpt2(weights)
    back = from_gpt2(hf, TINY)
    assert back.keys() == weights.keys() and all(torch.equal(back[n], weights[n]) for n in weights)
    config = transformers.GPT2Config(**{k: v for k, v in _gpt2_fields().items() if k != "model_type"})
    gpt2 = transformers.GPT2LMHeadModel(config).eval()
    gpt2.load_state_dict({**hf, "lm_head.weight": hf["transformer.wte.weight"]})
    load_bf16_state(model, weights)
    x = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(model(x), gpt2(input_ids=x.to(torch.long)).logits.float(), rtol=0, atol=1e-5)
    hf["transformer.h.0.attn.c_attn.bias"][0] = 1.0
    with pytest.raises(ValueError, match="not zero"):
        from_gpt2(hf, TINY)


def _gpt2_fields() -> dict[str, object]:
    from node.learn.hfexport import gpt2_config

    return gpt2_config(TINY)


def test_model_card_and_ledger_name_every_round(state_dir: Path, exported: Path) -> None:
    source = from_state_dir(state_dir)
    assert [r for r, _ in ledger.read(exported / "ledger.jsonl")] == list(range(ROUNDS))
    # the state folder keeps one round folder, yet its ledger holds every round
    assert len(list((state_dir / "validator").glob("round-*"))) == 1 and len(source.results) == ROUNDS
    card = (exported / "README.md").read_text()
    manifest = tiny_manifest()
    assert manifest.run_id in card and source.state_hash in card and f"| round | {ROUNDS} |" in card
    results = ledger.verify_chain(source.results, manifest.run_id, manifest.validators)
    for result in results:
        assert f"| {result.round} | " in card
        assert all(f"`{s.sender[:12]}`" in card for s in result.selected)
    assert load_manifest(exported / "run.toml").run_id == manifest.run_id
    assert (exported / "model.safetensors").stat().st_mode & 0o044 == 0o044  # readable by others: made to share


def test_verify_accepts_the_export_and_checks_w0(exported: Path) -> None:
    checked = verify_export(exported)
    assert checked.round == ROUNDS and len(checked.results) == ROUNDS
    assert checked.initial.startswith("round 0 starts from W_0")
    assert main(["export", "--verify", str(exported), "--json"]) == 0


TAMPERING = {"signature": InvalidSignature, "drop_round": BrokenChain, "weights": BrokenChain, "manifest": ConfigError}


@pytest.mark.parametrize("tamper", sorted(TAMPERING))
def test_verify_rejects_tampering(exported: Path, tmp_path: Path, tamper: str) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    lines = (copy / "ledger.jsonl").read_text().splitlines()
    if tamper == "signature":  # one bit of one signature
        record = json.loads(lines[1])
        envelope = bytearray.fromhex(record["envelope"])
        envelope[-1] ^= 1
        lines[1] = json.dumps({**record, "envelope": envelope.hex()}, sort_keys=True)
        (copy / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    elif tamper == "drop_round":
        (copy / "ledger.jsonl").write_text("\n".join([lines[0], *lines[2:]]) + "\n")
    elif tamper == "weights":  # other weights, no claim in the metadata: the chain does not end at them
        tensors = load_file(copy / "model.safetensors")
        tensors["transformer.ln_f.bias"] = tensors["transformer.ln_f.bias"] + 1
        save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    elif tamper == "manifest":  # naming another validator: another run id, under which nothing opens
        text = (copy / "run.toml").read_text()
        (copy / "run.toml").write_text(text.replace(identity_for("validator").public_hex, "ab" * 32))
    with pytest.raises(TAMPERING[tamper]):
        verify_export(copy)
    assert main(["export", "--verify", str(copy)]) == 1


def test_verify_rejects_a_chain_that_does_not_start_at_the_manifests_w0(tmp_path: Path) -> None:
    manifest = tiny_manifest()
    swarm = replace(make_swarm(run_id=manifest.run_id), init=unique_state(build_gpt(TINY, seed=9)))
    swarm.validator(tmp_path / "state" / "validator").run_round([])
    write_export(from_state_dir(tmp_path / "state"), manifest, tmp_path / "out")
    with pytest.raises(BrokenChain, match="W_0 of the manifest"):
        verify_export(tmp_path / "out")


def test_export_refuses_another_runs_manifest_and_a_non_empty_folder(state_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="do not belong to this manifest's run"):
        write_export(from_state_dir(state_dir), tiny_manifest(seed=7), tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("x")
    with pytest.raises(ConfigError, match="not an empty folder"):
        write_export(from_state_dir(state_dir), tiny_manifest(), tmp_path / "b")


def test_export_from_a_checkpoint(state_dir: Path, tmp_path: Path) -> None:
    source = from_state_dir(state_dir)
    blob = tmp_path / "checkpoint.safetensors"
    blob.write_bytes(checkpoint_bytes(source.weights))
    with pytest.raises(ProtocolError):
        from_checkpoint(blob, "0" * 64, ROUNDS)
    flags = ["--state-hash", source.state_hash, "--round", str(ROUNDS), "--config", str(_write_manifest(tmp_path))]
    code = main(["export", "--checkpoint", str(blob), *flags, "--out", str(tmp_path / "out")])
    assert code == 0
    checked = verify_export(tmp_path / "out")
    assert checked.state_hash == source.state_hash and checked.results == []
    assert "No ledger" in (tmp_path / "out" / "README.md").read_text()


def _write_manifest(folder: Path) -> Path:
    path = folder / "run.toml"
    path.write_text(tiny_manifest().to_toml())
    return path


QWEN_TINY = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
}


def test_hf_run_exports_in_its_own_architecture(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = tmp_path / "qwen-tiny"
    build_hf_from_config(QWEN_TINY, seed=3).lm.save_pretrained(model_path)
    byte_tokenizer().save_pretrained(model_path)
    manifest = tiny_manifest(kind="hf", path=str(model_path))
    ours = build_hf_from_config(QWEN_TINY, seed=4)  # trained weights differ from the files' W_0
    weights = bf16_state(ours)
    assert all(name.startswith("lm.") for name in weights) and "lm.lm_head.weight" not in weights  # tied
    blob = tmp_path / "checkpoint"
    blob.write_bytes(checkpoint_bytes(weights))
    write_export(from_checkpoint(blob, state_hash(weights), None), manifest, tmp_path / "out")

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert type(hf).__name__ == "Qwen2ForCausalLM"
    load_bf16_state(ours, weights)
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(ours(x), hf.eval()(input_ids=x).logits, rtol=0, atol=1e-5)
    assert AutoTokenizer.from_pretrained(tmp_path / "out")("ab")["input_ids"] == [97, 98]
    assert verify_export(tmp_path / "out").state_hash == state_hash(weights)
    assert unique_state(hf).keys() == {n.removeprefix("lm.") for n in weights}


def test_export_a_checkpoint_of_the_run_by_round_or_latest(tmp_path: Path) -> None:
    """`--checkpoint latest` or a round: the announcement names the state hash and the round, so
    nobody copies a 64-hex hash from an events file, and the round is always printed."""
    import asyncio

    from node.events import Events
    from node.net.memory import MemoryNetwork
    from node.roles.export import from_run
    from node.roles.records import run_records
    from node.roles.tasks import validator_for
    from node.run.setup import RunSetup
    from node.run.task import task_for
    from protocol.identity import Identity

    me = identity_for("validator")
    manifest = tiny_manifest()
    setup = RunSetup.from_manifest(manifest)
    net = MemoryNetwork(run_records(manifest))
    from node.roles.intake import RoundIntake

    events = Events("v")
    intake = RoundIntake(setup, events, tmp_path / "v" / "inbox")
    peer = net.join(me, tmp_path / "v", role="validator", intake=intake)
    service = validator_for(setup, task_for(setup), me, tmp_path / "v", peer, events, intake)
    publisher, v = service.publisher, service.validator
    reader = net.join(Identity.generate(), tmp_path / "reader", role="follower")

    async def main_() -> None:
        await publisher.announce_checkpoint(0, v.weights, v.state_hash)
        first = v.state_hash
        for _ in range(2):
            publisher.store_round(v.run_round([]), [])
        await publisher.announce_checkpoint(2, v.weights, v.state_hash)
        await publisher.publish_head(2, v.state_hash)
        latest = await from_run(reader, None)
        assert (latest.round, latest.state_hash) == (2, service.validator.state_hash)
        zero = await from_run(reader, 0)
        assert (zero.round, zero.state_hash) == (0, first)
        with pytest.raises(ConfigError, match=r"no checkpoint of that round .* the newest is of round 2"):
            await from_run(reader, 1)

    asyncio.run(main_())
    write_export(asyncio.run(from_run(reader, None)), manifest, tmp_path / "out")
    assert verify_export(tmp_path / "out").state_hash == service.validator.state_hash


def test_an_export_of_unknown_round_never_prints_round_none(
    state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = from_state_dir(state_dir)
    blob = tmp_path / "checkpoint.safetensors"
    blob.write_bytes(checkpoint_bytes(source.weights))
    flags = ["--state-hash", source.state_hash, "--config", str(_write_manifest(tmp_path))]
    assert main(["export", "--checkpoint", str(blob), *flags, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "unknown round" in out
