"""The campaign's crafted submissions, in process against the real validator: each one gets its
one outcome with the reason the defence gives (the swarm tier sends the same bytes over libp2p)."""

from __future__ import annotations

import hashlib
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch

from node.commands.roles import DEFAULT_CONFIG
from node.run.manifest import parse_manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.errors import MalformedPayload, SizeLimitExceeded
from protocol.identity import Identity
from protocol.signing import SignedMessage
from protocol.state import State
from protocol.statehash import state_hash
from pulse_redteam.campaign import crafting
from pulse_redteam.campaign.crafting import Forge
from pulse_redteam.campaign.swarms import rl_campaign_manifest
from validator.aggregate import global_norm
from validator.core import Validator
from validator.intake import Submission

EXPECTED = {  # attack -> (status, reason fragment)
    "oversize": ("rejected", "oversize"),
    "zstd-bomb": ("rejected", "undecodable"),
    "trailing": ("rejected", "TrailingBytes"),
    "out-of-range": ("rejected", "InvalidPositions"),
    "dup-positions": ("rejected", "InvalidPositions"),
    "nan": ("rejected", "NonFiniteValues"),
    "inf": ("rejected", "NonFiniteValues"),
    "junk": ("rejected", "undecodable"),
    "size-lie": ("rejected", "header says"),
    "other-run": ("ignored", "WrongRun"),
    "other-round": ("ignored", "future round"),
    "forged-sig": ("ignored", "InvalidSignature"),
    "copy": ("rejected", "copy of"),
    "near-copy": ("rejected", "copy of"),
    "ipm": ("rejected", ""),
}


def _key(label: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(f"pulse-test-campaign/{label}".encode()).digest())


@pytest.fixture(scope="module")
def validator(tmp_path_factory: pytest.TempPathFactory) -> tuple[Validator, RunSetup]:
    data: dict[str, Any] = tomllib.loads(DEFAULT_CONFIG.read_text())
    data["validators"] = [_key("validator").public_hex]
    setup = RunSetup.from_manifest(parse_manifest(data))
    folder: Path = tmp_path_factory.mktemp("validator")
    task = task_for(setup)
    v = Validator.create(
        folder,
        setup.manifest.gauntlet(),
        setup.run_id,
        _key("validator"),
        task.initial_master(),
        task.evaluator(),
        task.batch_fn(),
    )
    return v, setup


def _crafted(forge: Forge, honest: list[bytes]) -> dict[str, Submission]:
    small = forge.compress(forge.small_update(7))
    me = {name: _key(name) for name in EXPECTED}
    return {
        "oversize": forge.submission(me["oversize"], crafting.oversize(forge, 9)),
        "zstd-bomb": forge.submission(me["zstd-bomb"], crafting.zstd_bomb(forge)),
        "trailing": forge.submission(me["trailing"], crafting.trailing_bytes(forge, 1)),
        "out-of-range": forge.submission(me["out-of-range"], crafting.tampered_positions(forge, 2, "range")),
        "dup-positions": forge.submission(me["dup-positions"], crafting.tampered_positions(forge, 3, "duplicate")),
        "nan": forge.submission(me["nan"], crafting.poisoned_values(forge, 4, math.nan)),
        "inf": forge.submission(me["inf"], crafting.poisoned_values(forge, 5, math.inf)),
        "junk": forge.submission(me["junk"], crafting.junk(6)),
        "size-lie": forge.submission(me["size-lie"], small, payload_size=len(small) // 2),
        "other-run": crafting.other_run(forge, me["other-run"], small),
        "other-round": crafting.other_round(forge, me["other-round"], small),
        "forged-sig": crafting.forged_signature(forge, me["forged-sig"], small),
        "copy": forge.submission(me["copy"], honest[0]),
        "near-copy": forge.submission(me["near-copy"], crafting.near_copy(forge, honest[0], 8)),
        "ipm": forge.submission(me["ipm"], crafting.inner_product_manipulation(forge, honest)),
    }


def _trained(setup: RunSetup, miner: Identity, weights: State) -> bytes:
    trainer = task_for(setup).trainer(miner)
    return trainer.compress(trainer.train(0, weights), weights)


def test_each_crafted_submission_gets_its_reason(validator: tuple[Validator, RunSetup]) -> None:
    v, setup = validator
    forge = Forge(setup, v.round, v.weights, v.state_hash)
    miners = [_key(f"honest{i}") for i in range(3)]
    # honest updates, trained on each miner's own assignment, as real miners send them
    honest = [_trained(setup, m, v.weights) for m in miners]
    crafted = _crafted(forge, honest)
    subs = [forge.submission(m, p) for m, p in zip(miners, honest, strict=True)] + list(crafted.values())
    report = v.run_round(subs)
    assert len(report.outcomes) == len(subs)
    outcomes = dict(zip(crafted, report.outcomes[len(honest) :], strict=True))
    # only a record decides a copy group's owner (`copy_owners`); nobody here is on record, so the
    # victim and its exact copy are both rejected as copies of each other
    victim, copy = report.outcomes[0], outcomes.pop("copy")
    assert "copy of" in victim.reason and "copy of" in copy.reason, (victim, copy)
    for name, outcome in outcomes.items():
        status, fragment = EXPECTED[name]
        assert outcome.status == status and fragment in outcome.reason, (name, outcome.status, outcome.reason)
    assert all(o.status != "selected" for o in outcomes.values())


def test_a_tiny_dense_payload_declares_every_weight_in_a_few_hundred_bytes_and_is_refused() -> None:
    """The forgery is the run's own PULSELoCo payload with each stream cut to one word: it still
    declares every weight sent, and the decoder refuses it from the streams' sizes."""
    setup = RunSetup.from_manifest(rl_campaign_manifest(30.0, _key("validator").public_hex))
    gen = torch.Generator().manual_seed(0)
    weights = {
        "a": (torch.randn(64, 128, generator=gen) * 0.02).to(torch.bfloat16),
        "b": torch.ones(300, dtype=torch.bfloat16),
    }
    forge = Forge(setup, 0, weights, state_hash(weights))
    payload = crafting.tiny_dense(forge)
    assert len(payload) < 400
    with pytest.raises(SizeLimitExceeded, match="stream holds"):
        forge.codec.decompress(payload, weights)
    lm = Forge(RunSetup.from_manifest(parse_manifest(tomllib.loads(DEFAULT_CONFIG.read_text()))), 0, weights, "")
    with pytest.raises(ValueError, match="needs PULSELoCo"):
        crafting.tiny_dense(lm)


def test_a_noise_flood_sends_valid_payloads_at_the_trained_norm(validator: tuple[Validator, RunSetup]) -> None:
    """What `noise-flood` pushes passes every check before evaluation: it decodes, inside the norm band
    of the update its key trained (within 20%), with fresh keys, one per payload, new each round."""
    v, setup = validator
    forge = Forge(setup, v.round, v.weights, v.state_hash)
    trainer = task_for(setup).trainer(_key("noise-flood"))
    trained = trainer.train(0, v.weights)
    norm = global_norm(forge.codec.decompress(forge.compress(trained), v.weights))
    flood = crafting.noise_flood(forge, trained, seed=11, keys=3)
    again = crafting.noise_flood(forge, trained, seed=12, keys=3)
    senders = {SignedMessage.from_bytes(s.envelope).sender_hex for s, _ in flood + again}
    assert len(senders) == 6
    for sub, _ in flood:
        sent = global_norm(forge.codec.decompress(sub.read(), v.weights))
        assert abs(sent / norm - 1) < 0.2, (sent, norm)
    # `late-flood`: the same noise from other keys, each failing only once its body was read and decoded
    late = crafting.noise_flood(forge, trained, seed=11, keys=3, late=True)
    assert not senders & {SignedMessage.from_bytes(s.envelope).sender_hex for s, _ in late}
    for sub, _ in late:
        with pytest.raises(MalformedPayload) as info:
            forge.codec.decompress(sub.read(), v.weights)
        assert info.value.body_read
