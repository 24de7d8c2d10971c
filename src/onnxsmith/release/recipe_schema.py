"""What a recipe may hold: one description of its tables and keys that checks a recipe and documents it.

:data:`RECIPE` lists every table and key: its type, whether it is required, its
default, its allowed values, whether it names a file (relative to the recipe) and
whether that file is published. :func:`check` fits a parsed recipe to it, raising
:class:`SchemaError` at the key path of the first problem (release/recipe.py turns the
path into a line); :func:`reference` renders it as the key reference of docs/recipe.md
(a test keeps the two the same; ``python -m tools.recipe_reference`` rewrites it).

A step's options and the validation task's options are not listed here: they are the
fields of the transform's or the task's ``Options`` dataclass (the same as their
command-line flags, core/options.py), which :class:`OptionsFrom` names. What needs
more than one key's value or the files' contents (the sha256, the gates' metric names,
what a release may publish, names the release's files share) is checked by the reader.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxsmith.core import options as opts
from onnxsmith.core.errors import OnnxsmithError
from onnxsmith.core.registry import Registry
from onnxsmith.io.files import sha256_file
from onnxsmith.io.paths import file_kind
from onnxsmith.runtime.inputs import parse_shape_options
from onnxsmith.settings.bench import BenchOptions
from onnxsmith.settings.execution import ExecutionOptions
from onnxsmith.settings.gate import GateOptions
from onnxsmith.tasks import TASKS
from onnxsmith.transforms import TRANSFORMS

KeyPath = tuple  # of str (keys) and int (array indices), as tomllib's result is indexed


class SchemaError(Exception):
    """A recipe that does not fit the schema: the key path of the problem, and the problem."""

    def __init__(self, key: KeyPath, problem: str) -> None:
        super().__init__(problem)
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class Key:
    """One key and the value it holds."""

    name: str
    type: Any  # str, int, float, bool, list[str], list[int], dict[str, float]
    help: str
    required: bool = False
    #: When absent: a value, or a function of the table's values checked before it.
    default: Any = None
    default_help: str = ""  # how the docs show a default that is a function
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # numbers, and each number of a list
    maximum: float | None = None
    nonempty: bool = False  # a list
    pattern: str = ""  # a string (each string of a list) matches it whole
    pattern_help: str = ""  # ... which is this, in words
    #: "file" or "file or folder": relative to the recipe, it must exist; the value becomes its path.
    path: str = ""
    #: The file's contents go into the release: it must lie in the recipe's folder (the reader checks,
    #: knowing [release] allow_outside).
    published: bool = False
    #: In an array of tables: no two elements hold the same value; the problem, with {} for the value.
    unique: str = ""
    #: What a missing (or wrong) required key is reported as: "needs <this>"; or a function of the table.
    needs: str | Callable[[dict], str] = ""
    #: A last check of the value (of each item of a list): raises ValueError or OnnxsmithError.
    check: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class OptionsFrom:
    """A table's key that names a registered transform or task (``transform = "fp16"``, ``task = "lm"``); the
    table's other keys are the fields of that class's ``Options`` dataclass."""

    registry: Registry  # the key is its kind, documented by its help
    named: str  # how problems name the options: the table's label, then this with the name for {}
    help: str  # for the docs: whose options these are and where they are listed
    #: Older names of the key, still read (a recipe using one builds, with a note saying what to write).
    deprecated: tuple[str, ...] = ()

    @property
    def key(self) -> Key:
        kind = self.registry.kind
        return Key(kind, str, self.registry.help, required=True, needs=f'{kind} = "NAME"')

    def dataclass(self, name: str, called: str | None = None) -> type:
        """The Options dataclass of the class ``name`` names (UsageError naming the known ones otherwise)."""
        return self.registry.create(name, called=called).Options


@dataclass(frozen=True)
class Table:
    """A table, or an array of tables (``[[name]]`` sections or an array of inline tables)."""

    name: str
    help: str
    keys: tuple[Key | Table, ...] = ()
    array: bool = False
    required: bool = False
    nonempty: bool = False  # an array: at least one element
    needs: str = ""
    options: OptionsFrom | None = None
    exclusive: tuple[tuple[str, str], ...] = ()  # pairs of keys that may not both be given
    implied: bool = False  # absent, it is an empty table (its keys' defaults); otherwise None
    #: How problems name (an element of) it: (the enclosing label, the element's index, its values so far).
    label: Callable[[str, int | None, dict], str] | None = None

    @property
    def nodes(self) -> tuple[Key | Table, ...]:
        """Its keys and tables, the key naming its options first."""
        return ((self.options.key,) if self.options is not None else ()) + self.keys


@dataclass
class Checked:
    """A recipe fitted to the schema: plain values with defaults filled in, paths resolved against
    the recipe's folder, and each options table's dataclass under :data:`OPTIONS`."""

    values: dict
    #: Files whose contents the release publishes: (key path, how problems name the key, the value as
    #: written, its path).
    published: list[tuple[KeyPath, str, str, Path]] = field(default_factory=list)
    #: A deprecated key the recipe used: (its key path, what to write instead).
    deprecated: list[tuple[KeyPath, str]] = field(default_factory=list)


#: Where an options table's built dataclass is in its checked values (no table has a key of this name).
OPTIONS = "options"


def check(schema: Table, data: dict, folder: Path) -> Checked:
    """``data`` (tomllib's result) fitted to ``schema``; :class:`SchemaError` at the first problem."""
    checker = _Checker(folder)
    return Checked(checker.table(schema, data, (), ""), checker.published, checker.deprecated)


class _Checker:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.published: list[tuple[KeyPath, str, str, Path]] = []
        self.deprecated: list[tuple[KeyPath, str]] = []
        #: A key read under a deprecated name: its key path as checked -> the path as written (for its line).
        self.written: dict[KeyPath, KeyPath] = {}

    def table(self, table: Table, data: dict, key: KeyPath, label: str, index: int | None = None) -> dict:
        """``data`` checked as ``table``: ``label`` names the table in problems (or, when the table has a
        label function, the table around it)."""
        enclosing = label
        own = {node.name: node for node in table.nodes}
        values: dict = {}
        data = self.renamed(table, data, key)
        if table.label is not None:
            label = table.label(enclosing, index, values)
        if table.options is None:
            for name in data:
                if name not in own:
                    known = ", ".join(own)
                    raise SchemaError(
                        key + (name,),
                        f"{label} unknown key '{name}' (known: {known})"
                        if key
                        else f"unknown section or key '{name}' (a recipe has: {known})",
                    )
        for node in table.nodes:
            where = self.written.get(key + (node.name,), key + (node.name,))
            if node.name not in data:
                if node.required:
                    raise SchemaError(key, _needs(node, label, values))
                implied = isinstance(node, Table) and node.implied
                values[node.name] = self.table(node, {}, where, label) if implied else _default(node, values)
            elif isinstance(node, Table):
                values[node.name] = self.section(node, data[node.name], where, label)
            else:
                values[node.name] = self.value(node, data[node.name], where, label, values)
            if table.label is not None:
                label = table.label(enclosing, index, values)
        for a, b in table.exclusive:
            if a in data and b in data:
                raise SchemaError(key, f"{label} give {a} or {b}, not both")
        if table.options is not None:
            values[OPTIONS] = self.options(table.options, data, own, key, label, values)
        return values

    def renamed(self, table: Table, data: dict, key: KeyPath) -> dict:
        """``data`` with the naming key under its name where the recipe wrote a deprecated one (``pass``)."""
        if table.options is None or not isinstance(data, dict):
            return data
        name = table.options.key.name
        for old in table.options.deprecated:
            if old in data and name not in data:
                self.written[key + (name,)] = key + (old,)
                self.deprecated.append((key + (old,), f'`{old} = "..."` is deprecated: write `{name} = "..."`'))
                return {name if k == old else k: v for k, v in data.items()}
        return data

    def section(self, table: Table, data, key: KeyPath, label: str):
        """A table or an array of tables, inside a table whose problems are named ``label``."""
        own_label = (
            f"{label} {table.name}" if len(key) > 1 else f"[[{table.name}]]" if table.array else f"[{table.name}]"
        )
        if not table.array:
            if not isinstance(data, dict):
                raise SchemaError(key, f"{own_label} must be a table, not {_shown(data)}")
            return self.table(table, data, key, own_label)
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise SchemaError(key, f"{label} {table.name} must be an array of tables, not {_shown(data)}".lstrip())
        if table.nonempty and not data:
            raise SchemaError(key, _needs(table, label, {}))
        enclosing = label if table.label is not None else own_label
        elements: list[dict] = []
        for i, item in enumerate(data):
            values = self.table(table, item, key + (i,), enclosing, i)
            named = table.label(enclosing, i, values) if table.label is not None else own_label
            self.unique(table, item, values, elements, key + (i,), named)
            elements.append(values)
        return elements

    def unique(self, table: Table, item: dict, values: dict, earlier: list[dict], key: KeyPath, label: str) -> None:
        for node in table.nodes:
            if isinstance(node, Key) and node.unique and any(e[node.name] == values[node.name] for e in earlier):
                where = key + (node.name,) if node.name in item else key
                raise SchemaError(where, f"{label} {node.unique.format(values[node.name])}")

    def value(self, key: Key, value, where: KeyPath, label: str, values: dict):
        at = _misfit(key, value)
        if at is not None:  # the message shows the whole value; its line is the part's that does not fit
            if key.required and key.needs:
                raise SchemaError(where + at, f"{_needs(key, label, values)}, not {_shown(value)}")
            raise SchemaError(where + at, f"{label} {key.name} must be {_describe(key)}, not {_shown(value)}")
        if key.type is float:
            value = float(value)
        elif key.type == dict[str, float]:
            value = {name: float(number) for name, number in value.items()}
        if key.check is not None:
            for i, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
                try:
                    key.check(item)
                except (ValueError, OnnxsmithError) as err:
                    at = where if i is None else where + (i,)
                    raise SchemaError(at, f"{label} {getattr(err, 'problem', err)}") from None
        if key.path:
            value = self.paths(key.name, key.path, key.published, value, where, label)
        return value

    def paths(self, name: str, kind: str, published: bool, value, where: KeyPath, label: str):
        """Each path of ``value`` (a string or a list of them) checked and resolved against the folder."""
        many = isinstance(value, list)
        resolved = []
        for i, item in enumerate(value if many else [value]):
            at = where + (i,) if many else where
            path = self.folder / item
            if not path.exists():
                raise SchemaError(
                    at, f"{label} {name}: no such file or folder '{item}' (paths are relative to the recipe)"
                )
            found = file_kind(path)  # None: a regular file
            if found is not None and (kind == "file" or found != "a folder"):
                # A fifo or a device is never opened: reading one waits for a writer, or never ends.
                expected = "a file" if kind == "file" else "a regular file or a folder"
                raise SchemaError(at, f"{label} {name} is not {expected}: {item} is {found}")
            if published:
                self.published.append((at, f"{label} {name}", item, path))
            resolved.append(str(path))
        return resolved if many else resolved[0]

    def options(self, source: OptionsFrom, data: dict, own: dict, key: KeyPath, label: str, values: dict):
        """The Options dataclass the table's naming key names, built from the table's other keys."""
        name = values[source.key.name]
        where = self.written.get(key + (source.key.name,), key + (source.key.name,))
        try:
            cls = source.dataclass(name, called=where[-1])
        except OnnxsmithError as err:
            raise SchemaError(where, f"{label} {err.problem}") from None
        label = f"{label.rstrip(':')} {source.named.format(name)}:"
        given = {k: v for k, v in data.items() if k not in own}
        for option, value in given.items():  # one at a time first: a problem is reported at its key's line
            try:
                opts.build(cls, {option: value})
            except OnnxsmithError as err:
                raise SchemaError(key + (option,), f"{label} {err.problem}") from None
        try:
            built = opts.build(cls, given)
        except OnnxsmithError as err:
            raise SchemaError(key, f"{label} {err.problem}") from None
        for f in dataclasses.fields(cls):
            value = getattr(built, f.name)
            if f.metadata.get("path") and value:
                kind = "file" if f.metadata.get("path") == "file" else "file or folder"
                setattr(built, f.name, self.paths(f.name, kind, False, value, key + (f.name,), label))
        return built


def _default(node: Key | Table, values: dict):
    if isinstance(node, Table):
        return [] if node.array else None
    default = node.default
    if callable(default):
        return default(values)
    return list(default) if isinstance(default, list) else dict(default) if isinstance(default, dict) else default


def _needs(node: Key | Table, label: str, values: dict) -> str:
    needs = node.needs(values) if callable(node.needs) else node.needs
    return f"{label} needs {needs}" if label else needs


def _misfit(key: Key, value) -> KeyPath | None:
    """Where in ``value`` (a path inside it: () for all of it) it does not fit ``key``; None if it does."""
    origin = typing.get_origin(key.type)
    if origin in (list, dict):
        inner = typing.get_args(key.type)[-1]
        if not isinstance(value, origin) or (key.nonempty and not value):
            return ()
        items = enumerate(value) if origin is list else value.items()
        return next(((i,) for i, item in items if not _fits(inner, item, key)), None)
    return None if _fits(key.type, value, key) else ()


def _fits(kind: type, value, key: Key) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):
        number = (int, float) if kind is float else int
        if isinstance(value, bool) or not isinstance(value, number):
            return False
        if not math.isfinite(value):  # TOML writes nan and inf; no key of a recipe means either
            return False
        return (key.minimum is None or value >= key.minimum) and (key.maximum is None or value <= key.maximum)
    if kind is str:
        if not isinstance(value, str):
            return False
        if key.choices and value not in key.choices:
            return False
        return not key.pattern or re.fullmatch(key.pattern, value) is not None
    raise TypeError(f"the schema has no type {kind}")  # pragma: no cover - a schema bug


def _describe(key: Key, *, article: bool = True) -> str:
    """What ``key`` holds, in words: "a positive integer", "a list of strings", "one of cpu, cuda"."""
    origin = typing.get_origin(key.type)
    if origin is list:
        text = f"a list of {_scalar(typing.get_args(key.type)[0], key, True)}"
        if key.nonempty:
            text += " (at least one)"
    elif origin is dict:
        text = f"a table of {_scalar(typing.get_args(key.type)[1], key, True)}"
    else:
        text = _scalar(key.type, key, False)
    if not article:
        text = re.sub(r"^an? ", "", text)
    return text


def _scalar(kind: type, key: Key, plural: bool) -> str:
    if kind is str:
        if key.choices:
            return "one of " + ", ".join(key.choices)
        if key.pattern_help:
            return key.pattern_help
        return "strings" if plural else "a string"
    if kind is bool:
        return "booleans" if plural else "true or false"
    noun = ("integer" if kind is int else "number") + ("s" if plural else "")  # nan and inf are not numbers
    if key.minimum is not None and key.maximum is not None:
        text = f"{noun} in [{key.minimum:g}, {key.maximum:g}]"
    elif key.minimum is None:
        text = noun
    elif key.minimum == 1 and kind is int:
        text = f"positive {noun}"
    elif key.minimum == 0:
        text = f"non-negative {noun}"
    else:
        text = f"{noun} >= {key.minimum:g}"
    return text if plural else f"{'an' if text[0] in 'aeiou' else 'a'} {text}"


def _shown(value) -> str:
    """A value as TOML writes it (near enough: JSON's strings, numbers, arrays and true/false)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except TypeError:  # a date or time
        return str(value)


# ---- keys from a declared group of settings (core/options.py) ------------------------------


def keys_of(options_cls: type, **extra: dict[str, Any]) -> tuple[Key, ...]:
    """One key per field of a settings dataclass (settings/): its type, help, default and number range, as
    the command line and the API read the same field. ``extra``: per key, what only a recipe needs
    (``check``, ``nonempty``)."""
    keys = []
    for s in opts.settings_of(options_cls):
        kind = list[s.item] if s.kind is list else s.kind  # type: ignore[valid-type]
        number, choices = s.number, s.field.metadata.get("choices")
        fields: dict[str, Any] = {"default": s.default, "choices": tuple(choices or ())}
        if number is not None:
            fields.update(minimum=number.minimum, maximum=number.maximum)
        keys.append(Key(s.name, kind, s.help, **{**fields, **extra.get(s.name, {})}))
    return tuple(keys)


# ---- the recipe ---------------------------------------------------------------------------


def _source_sha256(values: dict) -> str:
    return f'sha256 to pin the source; this file\'s is "{sha256_file(values["path"])}"'


def _variant_label(_enclosing: str, _index: int | None, values: dict) -> str:
    return f"variant '{values['name']}':" if values.get("name") else "[[variants]]"


def _step_label(enclosing: str, index: int | None, _values: dict) -> str:
    return f"{enclosing.rstrip(':')} step {(index or 0) + 1}:"


def _shape(item: str) -> None:
    parse_shape_options([item], option="shape")


_VARIANT_NAME = "letters, digits, '.', '_', '-'"

RECIPE = Table(
    "recipe",
    "A release recipe.",
    keys=(
        Table(
            "source",
            "The model the release is made from, pinned by its sha256: the build refuses any other file.",
            required=True,
            needs="the recipe has no [source] section (path and sha256 of the source model)",
            keys=(
                Key(
                    "path",
                    str,
                    "the source .onnx",
                    required=True,
                    path="file",
                    needs='path = "the source .onnx"',
                ),
                Key(
                    "sha256",
                    str,
                    "the source's sha256 (a missing one is reported with the file's)",
                    required=True,
                    needs=_source_sha256,
                ),
            ),
        ),
        Table(
            "variants",
            "One table per variant the release publishes, each verified against the source first: by the one "
            "gate, whose bounds (`min_cosine`, `rtol`, `atol`, `min_agreement`) follow the number format the "
            "variant differs in unless given here.",
            array=True,
            required=True,
            nonempty=True,
            needs="the recipe has no variants ([[variants]] with a name and steps)",
            label=_variant_label,
            keys=(
                Key(
                    "name",
                    str,
                    "the variant's name in the card, the report and the build's messages",
                    required=True,
                    pattern="[A-Za-z0-9][A-Za-z0-9._-]*",
                    pattern_help=f"a name of {_VARIANT_NAME}",
                    unique="two variants are named '{}'",
                    needs=f'name = "..." ({_VARIANT_NAME})',
                ),
                Key(
                    "file",
                    str,
                    "the file it is written to in the release",
                    default=lambda values: f"{values['name']}.onnx",
                    default_help="NAME.onnx",
                    pattern=r"([A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*\.onnx",
                    pattern_help="a name ending in .onnx, optionally in one folder (onnx/model_q4.onnx)",
                    unique="another variant already writes {}",
                ),
                Key("description", str, "a sentence for the card", default=""),
                Table(
                    "steps",
                    "The transforms that make the variant, in order, each a table: "
                    '`steps = [{ transform = "fuse", precision = "fp16" }]`, or `[[variants.steps]]` sections '
                    '(`pass = "..."`, the older name of `transform`, is still read).',
                    array=True,
                    required=True,
                    needs='steps = [{ transform = "...", ... }, ...]',
                    label=_step_label,
                    options=OptionsFrom(
                        TRANSFORMS,
                        "({})",
                        "the options of the transform `transform` names: the same as its command-line flags "
                        "(`onnxsmith NAME --help`, docs/NAME.md)",
                        deprecated=("pass",),
                    ),
                ),
                *keys_of(GateOptions),
            ),
        ),
        Table(
            "validation",
            "How every variant is judged against the source on real data; a variant that fails a gate is "
            "not published.",
            options=OptionsFrom(
                TASKS,
                "task {}",
                "the options of the task `task` names: the same as `onnxsmith validate --task NAME`'s flags "
                "(`data`, `boxes`, `text`, `shape`, ...)",
            ),
            keys=(
                Key(
                    "gates",
                    dict[str, float],
                    "bounds on the task's metrics, `{ metric = bound }`; they replace the task's defaults",
                    default={},
                ),
                Key(
                    "calibration",
                    int,
                    "how many of the task's samples the transforms calibrate on (and their own gates run on)",
                    default=4,
                    minimum=1,
                ),
            ),
        ),
        Table(
            "bench",
            "Latency, throughput and peak memory of the source and each published variant, each in its own process.",
            keys=keys_of(BenchOptions, batch={"nonempty": True}, shape={"check": _shape}),
        ),
        Table(
            "execution",
            "Where the validation's samples run: in this process (the default) or on a Ray cluster, in shards; "
            "the numbers are the same either way. Relative `shard_dir` is the recipe's folder's.",
            implied=True,
            keys=keys_of(ExecutionOptions),
        ),
        Table(
            "release",
            "What else the release folder holds.",
            implied=True,
            keys=(
                Key(
                    "include",
                    list[str],
                    "more files for the release folder (a tokenizer, a config), pinned like the models",
                    default=[],
                    path="file",
                    published=True,
                ),
                Key(
                    "allow_outside",
                    bool,
                    "`include` and `license_file` may name files outside the recipe's folder (absolute paths, "
                    "`..`, symbolic links leading out); the card names every file taken from outside",
                    default=False,
                ),
            ),
        ),
        Table(
            "card",
            "The release's README.md.",
            implied=True,
            exclusive=(("license", "license_file"),),
            keys=(
                Key("title", str, "its heading (default: the source's name)", default=""),
                Key("description", str, "a paragraph under it (Markdown)", default=""),
                Key("license", str, "the weights' license text, passed through", default=""),
                Key("license_file", str, "... or a file holding it (UTF-8 text)", path="file", published=True),
                Key("homepage", str, "where the source model comes from", default=""),
            ),
        ),
    ),
)


# ---- the reference ------------------------------------------------------------------------


def reference(schema: Table = RECIPE) -> str:
    """The key reference of docs/recipe.md, in Markdown."""
    out: list[str] = []
    for node in schema.nodes:
        _reference_table(node, f"`[[{node.name}]]`" if node.array else f"`[{node.name}]`", out)
    return "\n".join(out).rstrip() + "\n"


def _reference_table(table: Table, heading: str, out: list[str]) -> None:
    presence = "required" if table.required else "optional"
    if table.nonempty:
        presence += ", one or more"
    out += [f"### {heading} ({presence})", "", table.help, ""]
    out += ["| key | value | default | meaning |", "|---|---|---|---|"]
    nested = []
    for node in table.nodes:
        if isinstance(node, Table):
            nested.append(node)
            what = "array of tables" if node.array else "table"
            out.append(f"| `{node.name}` | {what}{'; required' if node.required else ''} | | see below |")
        else:
            meaning = node.help.replace("|", "\\|")  # |Δ| is not a column
            out.append(f"| `{node.name}` | {_value_help(node)} | {_default_help(node)} | {meaning} |")
    if table.options is not None:
        out.append(f"| *any other key* | | | {table.options.help} |")
    for a, b in table.exclusive:
        out += ["", f"Give `{a}` or `{b}`, not both."]
    out.append("")
    for node in nested:
        _reference_table(node, f"`{node.name}`, in each {heading}", out)


def _value_help(key: Key) -> str:
    text = _describe(key, article=False)
    if key.path:
        text += f": the path of a {key.path}, relative to the recipe"
    if key.published:
        text += " and inside its folder (unless `allow_outside`)"
    if key.unique:
        text += "; unique among them"
    if key.required:
        text += "; required"
    return text.replace("|", "\\|")


def _default_help(key: Key) -> str:
    if key.required or (key.default is None and not key.default_help):
        return ""
    return f"`{key.default_help or _shown(key.default)}`"
