"""Run manifests: presets load, bad values and unknown keys fail naming the field, run id is stable."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from node.manifest import load_manifest, parse_manifest
from protocol.errors import ConfigError

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
