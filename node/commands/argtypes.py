"""Flag types that refuse bad numbers and paths at parse time, with one line naming the flag.

    parser.add_argument("--threads", type=at_least(0), default=0)
    parser.add_argument("--port", type=port)
    parser.add_argument("--key", type=key_file)

argparse turns an `ArgumentTypeError` into `pulse X: error: argument --flag: <reason>` and exit
status 2: no traceback, and nothing starts (a negative thread count, a port past 65535 or a key
path that is a folder used to fail later, in torch, in the socket layer or in the key loader).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

MAX_PORT = 65535


def at_least(low: int) -> Callable[[str], int]:
    """A whole number >= `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the least allowed, {low}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """A number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} seconds: give a finite number above 0")
    return value


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    if not text.isdigit() or int(text) > MAX_PORT:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a number from 0 to {MAX_PORT}")
    return int(text)


def _not_a_folder(path: Path) -> Path:
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a key file (make one: `pulse keygen --out FILE`)")
    return path


def key_file(text: str) -> Path:
    """A key file path: refused if it names a folder (a missing file is the loader's to report)."""
    try:
        return _not_a_folder(Path(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


KeyFile = Annotated[Path, AfterValidator(_not_a_folder)]
"""`key_file` for a typed options model (`node/commands/options.py`)."""


Port = Annotated[int, Field(ge=0, le=MAX_PORT)]
"""`port` for a typed options model."""

PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""`positive_seconds` for a typed options model."""
