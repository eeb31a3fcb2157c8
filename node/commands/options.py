"""A command's options declared once, as a pydantic model: its flags and help are generated from it.

    class ReceiptOptions(BaseModel):
        model_config = OPTIONS
        round: int = Field(ge=0)
        \"\"\"the round to explain\"\"\"

    add_options(parser, ReceiptOptions)            # --round, with the docstring as its help
    options = options_from(ReceiptOptions, args)   # validated; ConfigError: one line naming the flag

Each field is one flag (`state_dir` -> `--state-dir`; an alias names it otherwise); its docstring is
its help, its default is shown, a field without one is a required flag, `bool` is a switch,
`Literal[...]` of strings a choice, `X | None` an optional value and `list[X]` a flag taking
several (`--flag A B`). argparse only splits the command line: the values are checked by the model
(strict types, bounds, its rules across flags), so a bad value fails the same way whether it came
from a flag or a test, and the `argparse.Namespace` stays in `node/commands/`.

Why a helper and not typer: `pulse` is one argparse tree whose commands are imported lazily (`cli.py`)
and share network flags (`NetOptions`, which every such command's options inherit); this puts one
command's options on a model without a second CLI framework beside it, and the model (not click's
types) does the validating.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from protocol.errors import ConfigError
from protocol.parsing import STRICT, flag_line

OPTIONS = STRICT
"""The config of an options model: strict, closed, immutable, field docstrings as help."""

M = TypeVar("M", bound=BaseModel)
_SCALARS = (int, float, str, Path)


def add_options(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per field of `model` (see the module docstring). The fields of a base model that names
    a `flag_group` (`NetOptions`: "network") come last, under that heading in the help."""
    groups: dict[str, Any] = {}
    fields = sorted(model.model_fields.items(), key=lambda item: _group_of(model, item[0]) is not None)
    for name, field in fields:
        group = _group_of(model, name)
        target = parser if group is None else groups.setdefault(group, parser.add_argument_group(group))
        key = field.alias or name
        flag = "--" + key.replace("_", "-")
        help_text = (field.description or "").replace("%", "%%")  # argparse formats help with %
        kind, many, choices = _value_type(name, field)
        if kind is bool:
            target.add_argument(flag, dest=key, action="store_true", default=argparse.SUPPRESS, help=help_text)
            continue
        required = field.is_required()
        if not required and field.default is not None and not many:
            help_text += f" ({field.default})".replace("%", "%%")
        nargs = "*" if many else None
        target.add_argument(
            flag,
            dest=key,
            type=kind,
            nargs=nargs,
            choices=choices,
            required=required,
            default=argparse.SUPPRESS,
            help=help_text,
        )


def script_options(model: type[M], argv: list[str] | None, prog: str, description: str | None = None) -> M:
    """A `python -m` worker's command line as `model`: its flags generated from the model, and a bad
    value refused as argparse refuses a bad flag (`prog: error: --flag: ...`, exit status 2)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_options(parser, model)
    try:
        return options_from(model, parser.parse_args(argv))
    except ConfigError as exc:
        parser.error(str(exc))


def _group_of(model: type[BaseModel], name: str) -> str | None:
    """The `flag_group` of the class that declares field `name` (None: the command's own flags)."""
    for cls in model.__mro__:
        if name in getattr(cls, "__annotations__", {}):
            group = cls.__dict__.get("flag_group")
            return group if isinstance(group, str) else None
    return None


def options_from(model: type[M], args: argparse.Namespace) -> M:
    """The options the command line gave (the model's defaults for the others); `ConfigError` if invalid."""
    keys = [field.alias or name for name, field in model.model_fields.items()]
    try:
        return model.model_validate({key: getattr(args, key) for key in keys if hasattr(args, key)})
    except ValidationError as exc:
        raise ConfigError(flag_line(exc)) from exc


def parsed(model: type[M], args: argparse.Namespace, command: str) -> M | None:
    """`options_from`, or None after printing its one line (`pulse COMMAND: --flag: ...`): the caller
    returns exit status 2."""
    try:
        return options_from(model, args)
    except ConfigError as exc:
        print(f"pulse {command}: {exc}", file=sys.stderr)
        return None


def _value_type(name: str, field: FieldInfo) -> tuple[Any, bool, tuple[Any, ...] | None]:
    """The type a flag's text is parsed to (the annotation, without `| None`), whether the flag takes
    several values (`list[X]`: `--flag A B C`), and its choices (`Literal["a", "b"]`)."""
    annotation = field.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    many = get_origin(annotation) is list
    if many:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is Annotated:  # a constrained type: the text parses to its base type
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is Literal and all(isinstance(choice, str) for choice in get_args(annotation)):
        return str, many, get_args(annotation)
    if annotation is bool and many:
        raise TypeError(f"option {name}: no flag for a list of switches")
    if annotation is bool or (isinstance(annotation, type) and issubclass(annotation, _SCALARS)):
        return annotation, many, None
    raise TypeError(
        f"option {name}: no flag for {annotation!r} (int, float, str, Path, bool, Literal of str, X | None, list[X])"
    )
