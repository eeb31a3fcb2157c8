"""Option types that refuse bad numbers and paths when the command line is parsed, with one line
naming the flag.

    class RoleOptions(BaseModel):
        key: KeyFile = DEFAULT_KEY_PATH
        metrics_port: Port | None = None

An options model (`options.py`) checks them like any field: `pulse X: --flag: <reason>` and exit
status 2, no traceback, nothing started (a port past 65535 or a key path that is a folder used to
fail later, in the socket layer or in the key loader).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

MAX_PORT = 65535


def _not_a_folder(path: Path) -> Path:
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a key file (make one: `pulse keygen --out FILE`)")
    return path


KeyFile = Annotated[Path, AfterValidator(_not_a_folder)]
"""A key file path: refused if it names a folder (a missing file is the loader's to report)."""

Port = Annotated[int, Field(ge=0, le=MAX_PORT)]
"""A TCP port, 0 (any free one) to 65535."""

PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A number of seconds above 0, finite."""
