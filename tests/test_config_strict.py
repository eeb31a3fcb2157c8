"""Every config model a run manifest reaches is strict: a float for an int, an int for a bool or an
unknown key fails at load with the field named; models are frozen and every field has a docstring.

The models are found by walking the manifest's field annotations (and the validator's settings,
which the manifest builds, and the network settings a node starts with), so a new section or a
new nested model is checked without being listed here.
"""

from __future__ import annotations

import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from node.learn.model import GPTConfig
from node.net.netconfig import NetConfig
from node.net.retention import Retention
from node.net.streams import TransferLimits
from node.run.manifest import Manifest, parse_manifest
from protocol.errors import ConfigError
from validator.config import GauntletConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ROOTS: tuple[type[BaseModel], ...] = (Manifest, GauntletConfig, NetConfig, TransferLimits, Retention)


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation mentions (through unions, lists, Annotated, ...)."""
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        return [annotation] if issubclass(annotation, BaseModel) else []
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def reachable(roots: tuple[type[BaseModel], ...]) -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()
    todo = list(roots)
    while todo:
        model = todo.pop()
        if model not in found:
            found.add(model)
            todo += [m for info in model.model_fields.values() for m in models_in(info.annotation)]
    return found


def scalar_paths(model: type[BaseModel], kind: type, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Dotted paths of the manifest's fields annotated exactly `kind` (int or bool)."""
    paths: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        nested = models_in(info.annotation)
        if info.annotation is kind:
            paths.append((*prefix, name))
        elif len(nested) == 1 and info.annotation is nested[0]:
            paths += scalar_paths(nested[0], kind, (*prefix, name))
    return paths


def test_the_walk_finds_the_nested_configs() -> None:
    names = {m.__name__ for m in reachable(ROOTS)}
    assert {"GPTConfig", "InnerOptimConfig", "OuterConfig", "CodecOptions", "RLConfig", "TrainSection"} <= names
    assert ("model", "gpt", "n_layer") in scalar_paths(Manifest, int)
    assert ("train", "overlap") in scalar_paths(Manifest, bool)


@pytest.mark.parametrize("model", sorted(reachable(ROOTS), key=lambda m: m.__name__), ids=lambda m: m.__name__)
def test_every_reachable_config_is_strict_frozen_and_documented(model: type[BaseModel]) -> None:
    config = model.model_config
    assert (config.get("strict"), config.get("extra"), config.get("frozen")) == (True, "forbid", True)
    undocumented = [name for name, info in model.model_fields.items() if not info.description]
    assert not undocumented, f"{model.__name__}: fields without a docstring: {undocumented}"


def tiny() -> dict[str, Any]:
    return tomllib.loads((CONFIGS / "tiny.toml").read_text())


def set_path(data: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    data[path[-1]] = value


def value_at(manifest: BaseModel, path: tuple[str, ...]) -> Any:
    value: Any = manifest
    for key in path:
        value = getattr(value, key)
    return value


@pytest.mark.parametrize("path", scalar_paths(Manifest, int), ids=".".join)
def test_a_float_for_an_int_fails_naming_the_field(path: tuple[str, ...]) -> None:
    data = tiny()
    set_path(data, path, float(value_at(parse_manifest(tiny()), path)))  # e.g. n_layer = 2.0
    with pytest.raises(ConfigError, match=re.escape(".".join(path))):
        parse_manifest(data)


@pytest.mark.parametrize("path", scalar_paths(Manifest, bool), ids=".".join)
def test_an_int_for_a_bool_fails_naming_the_field(path: tuple[str, ...]) -> None:
    data = tiny()
    set_path(data, path, int(value_at(parse_manifest(tiny()), path)))
    with pytest.raises(ConfigError, match=re.escape(".".join(path))):
        parse_manifest(data)


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [
        (GPTConfig, "n_layer", 4.0),
        (TransferLimits, "max_fetch_streams", 16.0),
        (TransferLimits, "max_blob_bytes", "1024"),
        (Retention, "keep_rounds", 8.0),
        (NetConfig, "use_relay", 1),
        (NetConfig, "identity_path", "p2p.id"),
        (GauntletConfig, "top_g", 8.0),
        (GauntletConfig, "sketch_stride", 16.0),
    ],
)
def test_configs_built_in_code_are_strict_too(model: type[BaseModel], field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        model(**{field: value})
    with pytest.raises(ValidationError, match="extra"):
        model(**{f"{field}_typo": 1})
