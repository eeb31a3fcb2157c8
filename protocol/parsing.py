"""Strict parsing of pydantic models, the config every pulse model uses, and the one line a validation
error becomes.

    model = parse_canonical(Book, data, what="book", max_bytes=cap, encode=lambda m: dumps(m))
    raise ConfigError(f"run.toml: {one_line(exc, 'manifest')}") from exc

Every peer blob that is a JSON model (wire bodies, round evidence) goes through `parse_canonical`:
a size cap before parsing, the model's strict schema, then the canonical re-encoding must give the
same bytes. Every error a user or a log sees from a `ValidationError` is `one_line`: the first
error's location and message, with the location escaped (a key a peer chose must not forge a log
line) and cut to 80 characters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from protocol.errors import MalformedPayload, SizeLimitExceeded

M = TypeVar("M", bound=BaseModel)

STRICT = ConfigDict(strict=True, extra="forbid", frozen=True, use_attribute_docstrings=True)
"""The config of pulse's models (wire bodies, manifests, options, events): strict types, no unknown
fields, immutable, each field's docstring its description (an options model's help)."""


def one_line(exc: ValidationError, root: str) -> str:
    """`where: message` of the first error (`root` where the error is the whole input's)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or root
    where = ascii(where)[1:-1][:80]  # a key a peer chose: escaped, so it cannot forge a log line
    message = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own message
    return f"{where}: {message}"


def flag_line(exc: ValidationError, flags: Mapping[str, str] | None = None) -> str:
    """`--flag: message` of the first error of an options model (`one_line`, the field as its flag:
    `state_dir` -> `--state-dir`, `validators.2` -> `--validators`; `flags` names the flag of a field
    that is set by another name); the message alone for a rule across fields."""
    where, _, message = one_line(exc, "").partition(": ")
    field = where.partition(".")[0]
    if not field:
        return message
    return f"--{(flags or {}).get(field, field.replace('_', '-'))}: {message}"


def parse_canonical(cls: type[M], data: bytes, *, what: str, max_bytes: int, encode: Callable[[M], bytes]) -> M:
    """Parse `data` as a `cls`; `SizeLimitExceeded` past `max_bytes`, `MalformedPayload` for anything
    but the canonical encoding (`encode`) of one. `what` names it in the error."""
    if len(data) > max_bytes:
        raise SizeLimitExceeded(f"{what} is {len(data)} bytes, cap is {max_bytes}")
    try:
        model = cls.model_validate_json(data)
    except ValidationError as exc:
        raise MalformedPayload(f"{what}: {one_line(exc, what)}") from exc
    if encode(model) != data:
        raise MalformedPayload(f"{what} is not in canonical form")
    return model
