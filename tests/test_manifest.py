"""Run manifests: presets load, bad values and unknown keys fail naming the field, run id is stable."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from node.run.manifest import Manifest, SelectionSection, TrainSection, codec_for, load_manifest, parse_manifest
from protocol.errors import ConfigError
from protocol.pulseloco import PulseLoCoCodec
from protocol.sparseloco import SparseLoCoCodec
from validator.config import GauntletConfig, SelectionRules, UpdateRules

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.toml")))
def test_presets_load_and_round_trip(name: str) -> None:
    manifest = load_manifest(CONFIGS / name)
    again = parse_manifest(tomllib.loads(manifest.to_toml()))
    assert again == manifest
    assert again.run_id == manifest.run_id
    manifest.gauntlet()  # the validator accepts the settings


def _tiny() -> dict[str, object]:
    return tomllib.loads((CONFIGS / "tiny.toml").read_text())


def test_unknown_key_fails_naming_it() -> None:
    data = _tiny()
    data["train"]["inner_stepz"] = 3  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"train\.inner_stepz"):
        parse_manifest(data)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("train", "inner_steps", 0),
        ("train", "codec", "zip"),
        ("round", "deadline_seconds", -1.0),
        ("data", "seq_len", 4096),
    ],
)
def test_bad_values_fail_naming_the_field(section: str, key: str, value: object) -> None:
    data = _tiny()
    data[section][key] = value  # type: ignore[index]
    with pytest.raises(ConfigError, match=section):
        parse_manifest(data)


def test_strict_types() -> None:
    data = _tiny()
    data["train"]["inner_steps"] = "20"  # type: ignore[index]
    with pytest.raises(ConfigError, match="inner_steps"):
        parse_manifest(data)


def test_run_id_depends_on_every_field() -> None:
    base = parse_manifest(_tiny())
    other = _tiny()
    other["round"]["deadline_seconds"] = 31.0  # type: ignore[index]
    assert parse_manifest(other).run_id != base.run_id
    keyed = base.with_validators(["ab" * 32])
    assert keyed.run_id != base.run_id and keyed.validators == ["ab" * 32]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_manifest(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("key", "value"), [("k", 0), ("k", 4097), ("beta", 1.5), ("value_format", "fp16"), ("topk", 3)]
)
def test_bad_codec_option_fails_naming_it(key: str, value: object) -> None:
    data = _tiny()
    data["train"]["codec_options"] = {key: value}  # type: ignore[index]
    with pytest.raises(ConfigError, match=rf"train\.codec_options\.{key}"):
        parse_manifest(data)


def _with_codec(codec: str, **options: object) -> Manifest:
    data = _tiny()
    data["train"]["codec"] = codec  # type: ignore[index]
    data["train"]["codec_options"] = options  # type: ignore[index]
    return parse_manifest(data)


def test_codec_options_reach_the_codec_and_the_run_id() -> None:
    weights = {"w": torch.zeros(64, 128, dtype=torch.bfloat16)}  # two 64x64 tiles
    delta = {"w": torch.randn(64, 128, generator=torch.Generator().manual_seed(0))}
    sent = {}
    for k in (32, 64):
        manifest = _with_codec("sparseloco", k=k)
        assert manifest.gauntlet().codec_options.k == k  # the validator decodes with the same k
        _, _, stats = codec_for(manifest).compress(delta, None, weights)
        sent[k] = stats.sent
    assert sent == {32: 64, 64: 128}
    assert _with_codec("sparseloco", k=32).run_id != _with_codec("sparseloco", k=64).run_id
    fp32 = codec_for(_with_codec("pulseloco", value_format="fp32"))
    assert isinstance(fp32, PulseLoCoCodec) and fp32.value_format == "fp32"
    beta = codec_for(_with_codec("sparseloco", beta=0.5))
    assert isinstance(beta, SparseLoCoCodec) and beta.beta == 0.5


def test_the_manifest_composes_the_validators_own_settings() -> None:
    """`[train]` and `[selection]` extend the validator's models: each shared field is declared once,
    with one default and one docstring, and the defaults give the validator's defaults."""
    gauntlet_fields = set(GauntletConfig.model_fields)
    for section, rules in ((TrainSection, UpdateRules), (SelectionSection, SelectionRules)):
        assert issubclass(section, rules) and set(rules.model_fields) <= gauntlet_fields
        assert not (set(section.model_fields) - set(rules.model_fields)) & gauntlet_fields
        for name, info in rules.model_fields.items():
            assert repr(section.model_fields[name]) == repr(info) == repr(GauntletConfig.model_fields[name])
            assert info.description
    assert Manifest(name="x").gauntlet() == GauntletConfig()
    data = _tiny()
    data["selection"]["top_g"] = 3  # type: ignore[index]
    data["train"]["outer"] = {"lr": 0.5, "momentum": 0.9}  # type: ignore[index]
    cfg = parse_manifest(data).gauntlet()
    assert cfg.top_g == 3 and cfg.outer.lr == 0.5 and cfg.eval_step == pytest.approx(0.1)


def test_an_rl_run_needs_the_byte_level_gpt_and_no_overlap() -> None:
    rl = {"name": "r", "task": "rl", "train": {"overlap": False, "codec": "pulseloco"}}
    assert parse_manifest(rl).task == "rl"
    with pytest.raises(ConfigError, match="overlap"):
        parse_manifest({**rl, "train": {"codec": "pulseloco"}})
    with pytest.raises(ConfigError, match="byte-level GPT"):
        parse_manifest({**rl, "model": {"kind": "hf", "path": "/nowhere"}})
    with pytest.raises(ConfigError, match=r"rl\.group_size"):
        parse_manifest({**rl, "rl": {"group_size": 1}})


@pytest.mark.parametrize(
    ("name", "buffer"), [("qwen2.5-0.5b-home-gpu", torch.float32), ("qwen2.5-1.5b-home-gpu", torch.bfloat16)]
)
def test_the_home_presets_keep_the_pseudo_gradient_in_bf16_and_the_1_5b_buffer_too(
    name: str, buffer: torch.dtype
) -> None:
    """A home PC's host RAM: 2 bytes a parameter for the pseudo-gradient; at 1.5B, for the error buffer too
    (what fits 16 GiB; at 0.5B the FP32 buffer fits and keeps long runs' tiny residuals exactly)."""
    from node.run.presets import preset

    memory = load_manifest(preset(name)).train.memory
    assert (memory.error_dtype, memory.delta_dtype) == (buffer, torch.bfloat16)
