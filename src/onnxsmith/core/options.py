"""One definition of a transform's options, read from CLI flags or from a recipe.

A transform's ``Options`` is a dataclass. Each field becomes ``--field-name``
on the command line and ``field_name = ...`` in a recipe; ``help`` and
``choices`` come from the field's metadata::

    @dataclass
    class Options:
        block_size: int = option(32, "weights per quantization block")
        scheme: str = option("q4", "the number format", choices=["q4", "q8"])

(:func:`option` is ``dataclasses.field`` with that metadata.)

Booleans become ``--flag / --no-flag``; ``X | None = None`` means "decide
automatically" and is shown as such.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any

from onnxsmith.core.errors import UsageError


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    default_factory: Any = dataclasses.MISSING,
    choices: list[Any] | None = None,
) -> Any:
    """A field of an ``Options`` dataclass: its default, its help text and, where fixed, its choices."""
    metadata: dict[str, Any] = {"help": help} if choices is None else {"help": help, "choices": choices}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


# ---- argparse types: one per kind of number, so every command refuses nonsense in one line -----------
# (argparse reports an ArgumentTypeError as "argument --flag: <message>"; cli/main.py prints it as one line.)


def _number(text: str, kind: type[int] | type[float], what: str, ok: Callable[[float], bool]) -> int | float:
    try:
        value: int | float | None = kind(text)
    except (TypeError, ValueError, OverflowError):
        value = None
    if value is None or (kind is float and not math.isfinite(value)) or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """A seed, a count that may be 0 (warm-up runs, threads: 0 is onnxruntime's choice)."""
    return int(_number(text, int, "a non-negative integer", lambda v: v >= 0))


def positive_int(text: str) -> int:
    """A count of at least one (samples, runs, windows)."""
    return int(_number(text, int, "a positive integer", lambda v: v > 0))


def finite_float(text: str) -> float:
    """Any finite number: 'nan' and 'inf' are never a sensible option value."""
    return float(_number(text, float, "a finite number", lambda v: True))


def tolerance(text: str) -> float:
    """A gate's rtol / atol: finite and >= 0 (0 is exact, e.g. an absolute bound alone with rtol 0)."""
    return float(_number(text, float, "a finite number >= 0", lambda v: v >= 0))


def cosine(text: str) -> float:
    """A cosine similarity bound: in [-1, 1]."""
    return float(_number(text, float, "a cosine in [-1, 1]", lambda v: -1 <= v <= 1))


def share(text: str) -> float:
    """A share of values or rows (the gate's label agreement): in [0, 1]."""
    return float(_number(text, float, "a share in [0, 1]", lambda v: 0 <= v <= 1))


#: The argparse type of an ``Options`` field of each scalar type (ranges are the dataclass's ``validate()``).
ARGUMENT_TYPES: dict[Any, Callable[[str], Any]] = {int: int, float: finite_float}


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the scalar type, whether None is allowed) of a field annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0])[0], True
    if origin in (list, tuple):
        return list, False
    return annotation, False


def _fields(options_cls: type) -> list[tuple[dataclasses.Field[Any], Any, bool]]:
    hints = typing.get_type_hints(options_cls)
    return [(f, *_base_type(hints[f.name])) for f in dataclasses.fields(options_cls)]


def add_arguments(parser: argparse.ArgumentParser, options_cls: type) -> None:
    group = parser.add_argument_group("options")
    for f, kind, optional in _fields(options_cls):
        flag = "--" + f.name.replace("_", "-")
        help_text = _literal(f.metadata.get("help", ""))
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = _literal(str("automatic" if default is None and optional else default))
        if kind is bool:
            group.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{help_text} (default: {shown})",
            )
        elif kind is list:
            group.add_argument(
                flag,
                dest=f.name,
                default=None,
                metavar="A,B",
                type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                help=f"{help_text} (comma-separated; default: {shown})",
            )
        else:
            group.add_argument(
                flag,
                dest=f.name,
                type=ARGUMENT_TYPES.get(kind, kind),
                default=None,
                choices=f.metadata.get("choices"),
                help=f"{help_text} (default: {shown})",
            )


def _literal(text: str) -> str:
    """``text`` as argparse shows it: it formats help with ``%``, so "1 %" would break ``--help``."""
    return text.replace("%", "%%")


def from_args(args: argparse.Namespace, options_cls: type) -> Any:
    given = {
        f.name: getattr(args, f.name) for f, _, _ in _fields(options_cls) if getattr(args, f.name, None) is not None
    }
    return build(options_cls, given, where="command line")


def build(options_cls: type, mapping: dict[str, Any], *, where: str = "") -> Any:
    """Options from a mapping (a recipe table), every key checked against the dataclass."""
    known = {f.name: (f, kind, optional) for f, kind, optional in _fields(options_cls)}
    values = {}
    prefix = f"{where}: " if where else ""
    for key, value in mapping.items():
        name = key.replace("-", "_")
        if name not in known:
            raise UsageError(f"{prefix}unknown option '{key}' (known: {', '.join(sorted(known))})")
        f, kind, optional = known[name]
        values[name] = _coerce(value, kind, optional, f, prefix)
    try:
        options = options_cls(**values)
    except (TypeError, ValueError) as err:
        raise UsageError(f"{prefix}{err}") from None
    validate = getattr(options, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as err:
            raise UsageError(f"{prefix}{err}") from None
    return options


def _coerce(value: Any, kind: Any, optional: bool, f: dataclasses.Field[Any], prefix: str) -> Any:
    if value is None and optional:
        return None
    if kind is list:
        if isinstance(value, str):
            return [x.strip() for x in value.split(",") if x.strip()]
        if isinstance(value, (list, tuple)):
            return list(value)
    elif kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):  # TOML has nan and inf: no option means either
            raise UsageError(f"{prefix}option '{f.name}' expects a finite number, got {value!r}")
        return float(value)
    elif kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif kind is str and isinstance(value, str):
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise UsageError(f"{prefix}option '{f.name}' must be one of {', '.join(choices)}, not '{value}'")
        return value
    raise UsageError(f"{prefix}option '{f.name}' expects {kind.__name__}, got {value!r}")


def to_json(options: Any) -> dict[str, Any]:
    """The effective options, as stamped into provenance (deterministic, JSON-able)."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
