"""The run manifests that ship with pulse (`configs/*.toml`), found from a checkout or an install.

    preset("tiny")    # configs/tiny.toml: the embedded CPU default
    preset("rl")      # configs/rl.toml: the RL post-training preset

A source checkout reads the repository's `configs/`; an installed wheel carries the same files in
`<prefix>/share/pulse/configs` (pyproject's data-files). `PULSE_CONFIGS` overrides both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from protocol.errors import ConfigError


def configs_dir() -> Path:
    """The first folder of the candidates that holds the presets."""
    candidates = [Path(__file__).resolve().parents[2] / "configs", Path(sys.prefix) / "share" / "pulse" / "configs"]
    if os.environ.get("PULSE_CONFIGS"):
        candidates.insert(0, Path(os.environ["PULSE_CONFIGS"]))
    for folder in candidates:
        if (folder / "tiny.toml").is_file():
            return folder
    raise ConfigError(f"the shipped run manifests are missing (looked in {', '.join(map(str, candidates))})")


def preset(name: str) -> Path:
    """The path of `configs/<name>.toml`."""
    path = configs_dir() / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"no preset {name!r} in {path.parent}")
    return path
