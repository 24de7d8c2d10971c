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
automatically" and is shown as such; ``number=`` (a :class:`Number`: a cosine, a
share, a count, ...) gives a number its range, checked the same way everywhere.
``flag=`` names a flag that is not its field's name and ``aliases=`` more names of the
same flag (the inputs' ``feeds`` is ``--inputs``, also ``--calib``); the recipe key and
the API keyword stay the field's name.

Every group of settings is declared so: each transform's and each task's
options, the gate's bounds and the benchmark's settings (:mod:`onnxsmith.settings`).
Three renderers read the declaration: :func:`add_arguments` (argparse flags),
the recipe checker (``release/recipe_schema.keys_of``: keys, their line-numbered
problems and docs/recipe.md) and :func:`build` (the API's keyword check).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from onnxsmith.core.errors import UsageError


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    default_factory: Any = dataclasses.MISSING,
    choices: list[Any] | None = None,
    number: Number | None = None,
    repeat: bool = False,
    metavar: str | None = None,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A field of an ``Options`` dataclass: its default, its help text and, where fixed, its choices.

    ``number``: the range of a number (of each number of a list). ``repeat``: a list given by repeating
    the flag (its items may hold commas, ``--shape x:1,3``), not as one comma-separated value.
    ``flag``: the flag's name where it is not the field's (``"inputs"``: ``--inputs``); ``aliases``: more
    names of the same flag (``("calib",)``: ``--calib`` gives the same value), said so in its help.
    """
    metadata: dict[str, Any] = {"help": help}
    for key, value in (("choices", choices), ("number", number), ("metavar", metavar), ("flag", flag)):
        if value is not None:
            metadata[key] = value
    if repeat:
        metadata["repeat"] = True
    if aliases:
        metadata["aliases"] = tuple(aliases)
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def same_option(options_cls: type, name: str) -> Any:
    """The field ``name`` of ``options_cls`` declared again, its default, help and range alike: for a subclass
    that widens the field's type (the API's ``feeds`` takes arrays as well as the command line's paths)."""
    f = next(f for f in dataclasses.fields(options_cls) if f.name == name)
    return dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=f.metadata)


# ---- kinds of numbers: one per range, so every command, recipe and call refuses nonsense in one line -----
# (argparse reports an ArgumentTypeError as "argument --flag: <message>"; cli/main.py prints it as one line.)


@dataclasses.dataclass(frozen=True)
class Number:
    """A kind of number an option takes: int or float, its bounds (inclusive), and its name in messages."""

    kind: type[int] | type[float]
    words: str  # "a cosine in [-1, 1]": what the command line says it expected
    minimum: float | None = None
    maximum: float | None = None

    def holds(self, value: float) -> bool:
        return (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)

    def parse(self, text: str) -> int | float:
        """The number a flag's text gives (argparse's ``type``)."""
        return _number(text, self.kind, self.words, self.holds)

    @property
    def range(self) -> str:
        """The range in words, as a value's problem states it: "in [0, 1]", "a positive integer"."""
        noun = "integer" if self.kind is int else "number"
        if self.minimum is not None and self.maximum is not None:
            return f"in [{self.minimum:g}, {self.maximum:g}]"
        if self.minimum == 1 and self.kind is int:
            return "a positive integer"
        if self.minimum == 0:
            return f"a non-negative {noun}"
        return f"a {noun} >= {self.minimum:g}" if self.minimum is not None else f"a {noun}"

    def check(self, name: str, value: float) -> None:
        """ValueError naming ``name`` when ``value`` is out of range."""
        if not self.holds(value):
            raise ValueError(f"{name} must be {self.range}, not {value:g}")


FINITE = Number(float, "a finite number")
TOLERANCE = Number(float, "a finite number >= 0", minimum=0)  # a gate's rtol / atol: 0 is exact
COSINE = Number(float, "a cosine in [-1, 1]", minimum=-1, maximum=1)
SHARE = Number(float, "a share in [0, 1]", minimum=0, maximum=1)  # the gate's label agreement
COUNT = Number(int, "a non-negative integer", minimum=0)  # a seed; warm-up runs, threads (0: onnxruntime's)
POSITIVE = Number(int, "a positive integer", minimum=1)  # samples, runs, windows, batch sizes


def check_numbers(options: Any) -> None:
    """ValueError at the first field of ``options`` whose value is outside its :class:`Number`'s range."""
    for f in dataclasses.fields(options):
        number, value = f.metadata.get("number"), getattr(options, f.name)
        if number is None or value is None:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            number.check(f.name, item)


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
    return int(COUNT.parse(text))


def positive_int(text: str) -> int:
    """A count of at least one (samples, runs, windows)."""
    return int(POSITIVE.parse(text))


def finite_float(text: str) -> float:
    """Any finite number: 'nan' and 'inf' are never a sensible option value."""
    return float(FINITE.parse(text))


#: The argparse type of an ``Options`` field of each scalar type with no :class:`Number`.
ARGUMENT_TYPES: dict[Any, Callable[[str], Any]] = {int: int, float: finite_float}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of an options dataclass as the renderers read it."""

    field: dataclasses.Field[Any]
    kind: Any  # the scalar type: bool, int, float, str; list for a list
    optional: bool  # None is allowed: "automatic"
    item: Any = None  # a list's item type

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def help(self) -> str:
        return str(self.field.metadata.get("help", ""))

    @property
    def number(self) -> Number | None:
        return self.field.metadata.get("number")

    @property
    def flags(self) -> tuple[str, ...]:
        """Its flag (``--field-name`` unless declared otherwise), then the other names of the same flag."""
        names = (self.field.metadata.get("flag", self.name), *self.field.metadata.get("aliases", ()))
        return tuple("--" + name.replace("_", "-") for name in names)

    @property
    def default(self) -> Any:
        if self.field.default is not dataclasses.MISSING:
            return self.field.default
        if self.field.default_factory is not dataclasses.MISSING:
            return self.field.default_factory()
        return None

    def parse(self, text: str) -> Any:
        """A flag's text as a value of the scalar (or item) type."""
        if self.number is not None:
            return self.number.parse(text)
        kind = self.item if self.kind is list else self.kind
        return ARGUMENT_TYPES.get(kind, kind)(text)


def _base_type(annotation: Any) -> tuple[Any, bool, Any]:
    """(the scalar type, whether None is allowed, a list's item type) of a field annotation.

    A union of several types (the API's ``feeds``: arrays, a list of them or a path) is its own kind: no
    renderer makes a flag of it, and :func:`build` hands its value on as given, for its class to check."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) > 1:
            return annotation, True, None
        return _base_type(args[0])[0], True, _base_type(args[0])[2]
    if origin in (list, tuple) or annotation is list:
        items = typing.get_args(annotation)
        return list, False, items[0] if items else str
    return annotation, False, None


def settings_of(options_cls: type) -> list[Setting]:
    """The fields of an options dataclass, as every renderer reads them."""
    hints = typing.get_type_hints(options_cls)
    return [Setting(f, *_base_type(hints[f.name])) for f in dataclasses.fields(options_cls)]


def add_arguments(
    parser: argparse.ArgumentParser,
    options_cls: type,
    *,
    title: str = "options",
    skip: frozenset[str] = frozenset(),
    description: str | None = None,
    named_errors: bool = False,
    flags: Mapping[str, Sequence[str]] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One flag per field of ``options_cls`` (but those in ``skip``), in a group titled ``title``; every flag's
    default is None, so :func:`from_args` knows what was given and the dataclass supplies the rest.

    ``named_errors``: a value that does not parse is refused by a :class:`UsageError`, ``--flag expects int, got
    'x'`` (a task's options, worded so since ``validate`` had them; cli/main.py prints it as one line), rather
    than argparse's ``argument --flag: ...``. ``flags``: a command's own names for a field's flag, in place of
    the declared ones (``{"feeds": ("--input-data",)}`` where ``--inputs`` means something else).
    ``defaults``: a command's own default for a field, shown in ``--help`` and read back as if given
    (``{"samples": 2}``)."""
    group = parser.add_argument_group(title, description)
    for setting in settings_of(options_cls):
        if setting.name in skip:
            continue
        names = tuple((flags or {}).get(setting.name, ())) or setting.flags
        parse = _named_parse(setting, names[0]) if named_errors else setting.parse
        if defaults and setting.name in defaults:
            _add_argument(group, setting, parse, names, defaults[setting.name])
        else:
            _add_argument(group, setting, parse, names)


def _named_parse(setting: Setting, flag: str) -> Callable[[str], Any]:
    """``setting.parse``, its refusal naming the flag first."""
    kind = setting.item if setting.kind is list else setting.kind
    what = setting.number.words if setting.number else "a finite number" if kind is float else kind.__name__

    def parse(text: str) -> Any:
        try:
            return setting.parse(text)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            raise UsageError(f"{flag} expects {what}, got '{text}'") from None

    return parse


def _add_argument(
    group: argparse._ArgumentGroup,
    setting: Setting,
    parse: Callable[[str], Any],
    flags: Sequence[str],
    default: Any = dataclasses.MISSING,
) -> None:
    """The flag ``flags[0]`` (the others: more names of it) of ``setting``; ``default``: the command's own,
    given to argparse (else None: not given, the dataclass's default shown)."""
    f = setting.field
    help_text = _literal(setting.help)
    if len(flags) > 1:
        help_text += f"; {' or '.join(flags[1:])} {'is' if len(flags) == 2 else 'are'} the same flag"
    own_default = default is not dataclasses.MISSING
    if not own_default:
        default = setting.default
    shown = _literal(str("automatic" if default is None and setting.optional else default))
    if isinstance(default, list):
        shown = ",".join(str(v) for v in default) or "none"
    common: dict[str, Any] = {"dest": setting.name, "default": default if own_default else None}
    if setting.kind is bool:
        group.add_argument(
            *flags, action=argparse.BooleanOptionalAction, help=_with_default(help_text, shown), **common
        )
    elif setting.kind is list and f.metadata.get("repeat"):
        metavar = f.metadata.get("metavar", setting.name.upper())
        group.add_argument(
            *flags, action="append", type=parse, metavar=metavar, help=f"{help_text} (repeatable)", **common
        )
    elif setting.kind is list:
        group.add_argument(
            *flags,
            metavar=f.metadata.get("metavar", "A,B"),
            type=lambda text: [parse(x.strip()) for x in text.split(",") if x.strip()],
            help=f"{help_text} (comma-separated; default: {shown})",
            **common,
        )
    else:
        group.add_argument(
            *flags,
            type=parse,
            choices=f.metadata.get("choices"),
            metavar=f.metadata.get("metavar"),
            help=_with_default(help_text, shown),
            **common,
        )


def _with_default(help_text: str, shown: str) -> str:
    """``help_text (default: shown)``; a help that states its default in its own words keeps those alone."""
    return help_text if "(default:" in help_text or "(automatic:" in help_text else f"{help_text} (default: {shown})"


def _literal(text: str) -> str:
    """``text`` as argparse shows it: it formats help with ``%``, so "1 %" would break ``--help``."""
    return text.replace("%", "%%")


def given_args(args: argparse.Namespace, options_cls: type) -> dict[str, Any]:
    """The fields of ``options_cls`` whose flags were given, or that have the command's own default
    (:func:`add_arguments` leaves the others None)."""
    return {s.name: getattr(args, s.name) for s in settings_of(options_cls) if getattr(args, s.name, None) is not None}


def from_args(args: argparse.Namespace, options_cls: type) -> Any:
    return build(options_cls, given_args(args, options_cls), where="command line")


def build(options_cls: type, mapping: dict[str, Any], *, where: str = "") -> Any:
    """Options from a mapping (a recipe table, an API call's keywords), every key checked against the dataclass."""
    known = {s.name: s for s in settings_of(options_cls)}
    values = {}
    prefix = f"{where}: " if where else ""
    for key, value in mapping.items():
        name = key.replace("-", "_")
        if name not in known:
            raise UsageError(f"{prefix}unknown option '{key}' (known: {', '.join(sorted(known))})")
        values[name] = _coerce(value, known[name], prefix)
    try:
        options = options_cls(**values)
        check_numbers(options)
    except (TypeError, ValueError) as err:
        raise UsageError(f"{prefix}{err}") from None
    validate = getattr(options, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as err:
            raise UsageError(f"{prefix}{err}") from None
    return options


#: The kinds of values the renderers know (flags, recipe keys); a field of another type (a class, a union of
#: several types) is taken by :func:`build` as given, its class checking it.
_RENDERED = (bool, int, float, str, list)


def _coerce(value: Any, setting: Setting, prefix: str) -> Any:
    if value is None and setting.optional:
        return None
    if setting.kind not in _RENDERED:
        return value
    if setting.kind is list:
        if isinstance(value, str) and setting.item is str and not setting.field.metadata.get("repeat"):
            return [x.strip() for x in value.split(",") if x.strip()]
        if isinstance(value, (list, tuple)):
            return [_scalar(item, setting.item, setting, prefix) for item in value]
        raise UsageError(f"{prefix}option '{setting.name}' expects a list, got {value!r}")
    return _scalar(value, setting.kind, setting, prefix)


def _scalar(value: Any, kind: Any, setting: Setting, prefix: str) -> Any:
    name = setting.name
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(value):  # TOML has nan and inf: no option means either
            raise UsageError(f"{prefix}option '{name}' expects a finite number, got {value!r}")
        return float(value)
    elif kind is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)  # a numpy integer too (an API call's)
    elif kind is str and isinstance(value, (str, os.PathLike)):
        value = os.fspath(value)  # a folder or file given as a Path (an API call's)
        choices = setting.field.metadata.get("choices")
        if choices and value not in choices:
            raise UsageError(f"{prefix}option '{name}' must be one of {', '.join(choices)}, not '{value}'")
        return value
    raise UsageError(f"{prefix}option '{name}' expects {kind.__name__}, got {value!r}")


def to_json(options: Any) -> dict[str, Any]:
    """The effective options, as stamped into provenance (deterministic, JSON-able)."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
