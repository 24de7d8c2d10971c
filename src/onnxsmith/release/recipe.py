"""A release recipe: one TOML file that says how a release is built.

::

    [source]
    path = "model.onnx"                      # relative to the recipe
    sha256 = "9f2c…"                         # the build refuses any other file

    [[variants]]
    name = "fused-fp16"                      # written as fused-fp16.onnx (or `file = ...`)
    steps = [{ pass = "fuse", precision = "fp16" }]   # transforms in order, with their options

    [validation]
    task = "faceage"                         # plus the task's options: data, boxes, min_face, ...
    data = "images"
    boxes = "images/boxes.txt"
    gates = { max_abs_age_error = 0.1, gender_agreement = 1.0, nonfinite = 0 }

    [bench]
    batch = [1, 5, 10]

    [card]
    title = "..."
    license_file = "LICENSE.txt"

Everything is checked before any work starts: unknown sections, keys, passes
or options, wrong types, missing files and a source whose sha256 differs are
reported as ``recipe.toml:LINE: problem`` (exit 2). tomllib gives no positions,
so :func:`key_lines` scans the text for the line of every key.

What a release publishes is checked too: ``include`` and ``license_file`` must be
regular files inside the recipe's folder (after symbolic links; ``[release]
allow_outside = true`` lifts this, and the card then names what came from
outside), a license is UTF-8 text, and no two files of the release, nor a file
and a variant's folder, share a name (the files a build writes itself included).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxsmith.core.errors import InputError, OnnxsmithError
from onnxsmith.io.files import sha256_file
from onnxsmith.core import options as opts
from onnxsmith.io.save import data_file_name
from onnxsmith.release.bench import BenchSettings
from onnxsmith.tasks import get_task
from onnxsmith.tasks.base import Task
from onnxsmith.transforms import get_transform

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

KeyPath = tuple  # of str (keys) and int (array indices)
# Matched whole (fullmatch): "$" would also match before a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: A variant's file: a name, or one folder and a name (onnx/model_q4.onnx, as transformers.js expects).
_FILE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*\.onnx")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SECTIONS = ("source", "variants", "validation", "bench", "card", "release")

# The files every build writes into a release: nothing else in the release may take their names.
CARD = "README.md"
CHECKSUMS = "SHA256SUMS"
MEASUREMENTS = "measurements.json"
REPORT = "report.html"
RECIPE_COPY = "recipe.toml"
GENERATED = (CARD, CHECKSUMS, MEASUREMENTS, REPORT, RECIPE_COPY)


class RecipeError(InputError):
    """A problem with the recipe, reported at its line."""

    def __init__(self, problem: str, recipe: Path, line: int | None) -> None:
        super().__init__(problem, f"{recipe}:{line}" if line else recipe)


# ---- the sections -------------------------------------------------------------------------


@dataclass
class SourceFields:
    path: str = field(default="", metadata={"help": "the source .onnx, relative to the recipe", "path": True})
    sha256: str = field(default="", metadata={"help": "its expected sha256"})


@dataclass
class BenchFields:
    batch: list[int] = field(default_factory=lambda: [1], metadata={"help": "batch sizes"})
    provider: str = field(default="cpu", metadata={"choices": ["cpu", "cuda"], "help": "execution provider"})
    runs: int = field(default=20, metadata={"help": "timed runs per batch size"})
    warmup: int = field(default=3, metadata={"help": "untimed runs before them"})
    threads: int | None = field(default=None, metadata={"help": "intra-op threads (default: onnxruntime's)"})
    shape: list[str] = field(default_factory=list, metadata={"help": "NAME:D0,D1 or DIM=N for other dims"})

    def validate(self) -> None:
        if not self.batch or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in self.batch):
            raise ValueError("batch must be a list of positive integers")
        if self.runs < 1 or self.warmup < 0:
            raise ValueError("runs must be >= 1 and warmup >= 0")


@dataclass
class CardFields:
    title: str = field(default="", metadata={"help": "the card's heading"})
    description: str = field(default="", metadata={"help": "a paragraph under it (Markdown)"})
    license: str = field(default="", metadata={"help": "license text of the weights, passed through"})
    license_file: str | None = field(
        default=None, metadata={"help": "or a file holding it (UTF-8 text)", "path": True, "published": True}
    )
    homepage: str = field(default="", metadata={"help": "where the source model comes from"})

    def validate(self) -> None:
        if self.license and self.license_file:
            raise ValueError("give license or license_file, not both")


@dataclass
class ReleaseFields:
    include: list[str] = field(
        default_factory=list,
        metadata={
            "help": "more files for the release folder (a tokenizer, a config), relative to the recipe",
            "path": True,
            "published": True,
        },
    )
    allow_outside: bool = field(
        default=False,
        metadata={
            "help": "include and license_file may name files outside the recipe's folder (absolute paths, "
            "'..', symbolic links leading out); the card names every file taken from outside"
        },
    )


@dataclass
class Step:
    name: str  # the transform
    options: Any
    line: int | None


@dataclass
class Variant:
    name: str
    file: str
    steps: list[Step]
    description: str = ""
    atol: float | None = None
    rtol: float | None = None
    line: int | None = None


@dataclass
class ValidationSpec:
    task: Task
    options: Any
    gates: dict[str, float]
    #: How many of the task's samples the transforms calibrate on (and their own gate runs on).
    calibration: int = 4


@dataclass
class Recipe:
    path: Path
    text: str
    source: Path
    source_sha256: str
    variants: list[Variant]
    validation: ValidationSpec | None
    bench: BenchSettings | None
    card: CardFields
    #: Files copied into the release beside the variants (and pinned with them), named as the recipe names them.
    include: list[Path] = field(default_factory=list)
    lines: dict[KeyPath, int] = field(default_factory=dict, repr=False)
    #: The card's license text (``license``, or what ``license_file`` holds, read when the recipe is).
    license: str = ""
    #: What the release takes from outside the recipe's folder (``allow_outside = true``): include
    #: names, and "license_file" for the license text. The card lists them.
    outside: list[str] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        return self.path.parent

    def license_text(self) -> str:
        return self.license


# ---- reading ------------------------------------------------------------------------------


def load_recipe(path: str | Path) -> Recipe:
    """Read and check a recipe; raise :class:`RecipeError` at the offending line."""
    path = Path(path)
    if not path.is_file():
        raise InputError("no such recipe file" if not path.exists() else "is not a file", path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read the recipe ({err})", path) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        message = str(err)
        found = re.search(r"\(at line (\d+), column (\d+)\)", message)
        line = int(found.group(1)) if found else None
        if found is None and "end of document" in message:  # point at the last line with text
            line = len(text.rstrip().splitlines()) or 1
        problem = re.sub(r"\s*\(at line \d+, column (\d+)\)", r" (column \1)", message)
        raise RecipeError(f"not valid TOML: {problem}", path, line) from None
    return _Reader(path, text, data).recipe()


class _Reader:
    def __init__(self, path: Path, text: str, data: dict) -> None:
        self.path = path
        self.data = data
        self.text = text
        self.lines = key_lines(text)
        self.allow_outside = False
        self.outside: list[str] = []

    def line(self, key: KeyPath) -> int | None:
        for n in range(len(key), 0, -1):
            if key[:n] in self.lines:
                return self.lines[key[:n]]
        return None

    def fail(self, key: KeyPath, problem: str):
        raise RecipeError(problem, self.path, self.line(key))

    def table(self, key: KeyPath, value, what: str) -> dict:
        if not isinstance(value, dict):
            self.fail(key, f"{what} must be a table, got {type(value).__name__}")
        return value

    def recipe(self) -> Recipe:
        for name in self.data:
            if name not in SECTIONS:
                self.fail((name,), f"unknown section or key '{name}' (a recipe has: {', '.join(SECTIONS)})")
        source, sha = self.source()
        variants = self.variants()
        validation = self.validation()
        bench = None
        if "bench" in self.data:
            fields = self.fields(
                ("bench",), BenchFields, self.table(("bench",), self.data["bench"], "[bench]"), "[bench]"
            )
            bench = BenchSettings(
                batches=list(fields.batch),
                provider=fields.provider,
                runs=fields.runs,
                warmup=fields.warmup,
                threads=fields.threads,
                shape=list(fields.shape),
            )
        # [release] first: its allow_outside governs the card's license_file too.
        release = self.fields(
            ("release",),
            ReleaseFields,
            self.table(("release",), self.data.get("release", {}), "[release]"),
            "[release]",
        )
        card = self.fields(("card",), CardFields, self.table(("card",), self.data.get("card", {}), "[card]"), "[card]")
        include = [Path(p) for p in release.include]
        self.check_layout(variants, include)
        license_text = card.license
        if card.license_file:
            license_text = self.text_file(("card", "license_file"), Path(card.license_file), "[card] license_file")
        return Recipe(
            self.path,
            self.text,
            source,
            sha,
            variants,
            validation,
            bench,
            card,
            include,
            self.lines,
            license=license_text,
            outside=self.outside,
        )

    def check_layout(self, variants: list[Variant], include: list[Path]) -> None:
        """Every file of the release has a name of its own, and no folder is named like a file."""
        owners: dict[str, str] = {name: f"the release's own {name}" for name in GENERATED}
        for v in variants:
            if "/" not in v.file:
                owners[v.file] = f"variant '{v.name}''s file"
                owners[data_file_name(v.file)] = f"variant '{v.name}''s data file"
        for i, path in enumerate(include):
            key = ("release", "include", i)
            if _CONTROL.search(path.name):
                self.fail(key, f"[release] include: the name {path.name!r} has a control character")
            if path.name in owners:
                self.fail(key, f"[release] include: {path.name} would take the name of {owners[path.name]}")
            owners[path.name] = f"the included {path.name}"
        for i, v in enumerate(variants):
            folder = v.file.partition("/")[0] if "/" in v.file else None
            if folder in owners:
                self.fail(
                    ("variants", i, "file"),
                    f"variant '{v.name}': file {v.file} needs a folder '{folder}', "
                    f"which is the name of {owners[folder]}",
                )

    def text_file(self, key: KeyPath, path: Path, what: str) -> str:
        """A text file's contents (UTF-8, no NUL bytes: it goes into the card)."""
        try:
            data = path.read_bytes()
        except OSError as err:
            self.fail(key, f"{what}: cannot read {path.name} ({err.strerror or err})")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            self.fail(
                key, f"{what}: {path.name} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})"
            )
        if "\0" in text:
            self.fail(key, f"{what}: {path.name} is binary (a NUL byte at offset {text.index(chr(0))}), not text")
        return text

    def published(self, key: KeyPath, what: str, item: str, path: Path) -> Path:
        """``path`` (``item`` as the recipe wrote it) checked as a file whose contents go into the release.

        It must be a regular file (after symbolic links) inside the recipe's folder, unless the
        recipe says ``allow_outside = true``: a recipe must not publish /etc/shadow by accident."""
        real = path.resolve()
        if not real.is_file():
            self.fail(key, f"{what}: '{item}' is not a regular file")
        if not real.is_relative_to(self.path.parent.resolve()):
            if not self.allow_outside:
                self.fail(
                    key,
                    f"{what}: '{item}' resolves to {real}, outside the recipe's folder; only files inside it "
                    "are published, unless [release] says allow_outside = true",
                )
            self.outside.append(path.name if key[0] == "release" else key[-1])
        return real

    def fields(self, key: KeyPath, cls, table: dict, what: str, *, skip: tuple[str, ...] = ()):
        """``cls`` built from ``table`` (an Options-style dataclass), each key checked at its own line."""
        given = {k: v for k, v in table.items() if k not in skip}
        for name, value in given.items():
            try:
                opts.build(cls, {name: value})
            except OnnxsmithError as err:
                self.fail(key + (name,), f"{what} {err.problem}")
        try:
            built = opts.build(cls, given)
        except OnnxsmithError as err:
            self.fail(key, f"{what} {err.problem}")
        if cls is ReleaseFields:
            self.allow_outside = built.allow_outside
        for f in dataclasses.fields(cls):
            value = getattr(built, f.name)
            if f.metadata.get("path") and value:
                many = isinstance(value, list)
                resolved = []
                for i, item in enumerate(value if many else [value]):
                    where = key + (f.name, i) if many else key + (f.name,)
                    path = self.path.parent / item
                    if not path.exists():
                        self.fail(
                            where,
                            f"{what} {f.name}: no such file or folder '{item}' (paths are relative to the recipe)",
                        )
                    if f.metadata.get("published"):
                        self.published(where, f"{what} {f.name}", item, path)
                    resolved.append(str(path))
                setattr(built, f.name, resolved if many else resolved[0])
        return built

    def source(self) -> tuple[Path, str]:
        if "source" not in self.data:
            self.fail((), "the recipe has no [source] section (path and sha256 of the source model)")
        table = self.table(("source",), self.data["source"], "[source]")
        fields = self.fields(("source",), SourceFields, table, "[source]")
        if not fields.path:
            self.fail(("source",), '[source] needs path = "the source .onnx"')
        source = Path(fields.path)
        if not source.is_file():
            self.fail(("source", "path"), f"[source] path is not a file: {table['path']}")
        actual = sha256_file(source)
        if not fields.sha256:
            self.fail(("source",), f'[source] needs sha256 to pin the source; this file\'s is "{actual}"')
        if fields.sha256.lower() != actual:
            self.fail(
                ("source", "sha256"),
                f"[source] sha256 mismatch: the recipe expects {fields.sha256} but {table['path']} has {actual}",
            )
        return source, actual

    def variants(self) -> list[Variant]:
        items = self.data.get("variants")
        if not items:
            self.fail(
                ("variants",) if "variants" in self.data else (),
                "the recipe has no variants ([[variants]] with a name and steps)",
            )
        if not isinstance(items, list):
            self.fail(("variants",), "variants must be an array of tables ([[variants]])")
        variants: list[Variant] = []
        for i, item in enumerate(items):
            key = ("variants", i)
            item = self.table(key, item, "each [[variants]] entry")
            for name in item:
                if name not in ("name", "file", "steps", "description", "atol", "rtol"):
                    self.fail(
                        key + (name,),
                        f"[[variants]] unknown key '{name}' (known: name, file, steps, description, atol, rtol)",
                    )
            name = item.get("name")
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                self.fail(key + ("name",), "[[variants]] needs name = \"...\" (letters, digits, '.', '_', '-')")
            if any(v.name == name for v in variants):
                self.fail(key + ("name",), f"two variants are named '{name}'")
            file = item.get("file", f"{name}.onnx")
            if not isinstance(file, str) or not _FILE.fullmatch(file):
                self.fail(
                    key + ("file",),
                    f"variant '{name}': file must be a name ending in .onnx, "
                    "optionally in one folder (onnx/model_q4.onnx)",
                )
            if any(v.file == file for v in variants):
                self.fail(key + ("file",), f"variant '{name}': another variant already writes {file}")
            for tolerance in ("atol", "rtol"):
                value = item.get(tolerance)
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                    self.fail(key + (tolerance,), f"variant '{name}': {tolerance} must be a non-negative number")
            description = item.get("description", "")
            if not isinstance(description, str):
                self.fail(key + ("description",), f"variant '{name}': description must be a string")
            steps = item.get("steps")
            if not isinstance(steps, list):
                self.fail(
                    key + ("steps",) if "steps" in item else key,
                    f"variant '{name}' needs steps = [{{ pass = \"...\", ... }}, ...]",
                )
            variants.append(
                Variant(
                    name=name,
                    file=file,
                    steps=[self.step(key + ("steps", j), step, name, j) for j, step in enumerate(steps)],
                    description=description,
                    atol=None if item.get("atol") is None else float(item["atol"]),
                    rtol=None if item.get("rtol") is None else float(item["rtol"]),
                    line=self.line(key),
                )
            )
        return variants

    def step(self, key: KeyPath, step, variant: str, index: int) -> Step:
        step = self.table(key, step, f"variant '{variant}' step {index + 1}")
        name = step.get("pass")
        if not isinstance(name, str):
            self.fail(key, f"variant '{variant}' step {index + 1} needs pass = \"NAME\"")
        try:
            transform = get_transform(name)
        except OnnxsmithError as err:
            self.fail(key + ("pass",), f"variant '{variant}' step {index + 1}: {err.problem}")
        options = self.fields(
            key, transform.Options, step, f"variant '{variant}' step {index + 1} ({name}):", skip=("pass",)
        )
        return Step(name, options, self.line(key))

    def validation(self) -> ValidationSpec | None:
        if "validation" not in self.data:
            return None
        key = ("validation",)
        table = self.table(key, self.data["validation"], "[validation]")
        name = table.get("task")
        if not isinstance(name, str):
            self.fail(key, '[validation] needs task = "NAME"')
        try:
            task = get_task(name)
        except OnnxsmithError as err:
            self.fail(key + ("task",), f"[validation] {err.problem}")
        options = self.fields(
            key, task.Options, table, f"[validation] task {name}:", skip=("task", "gates", "calibration")
        )
        gates_table = self.table(key + ("gates",), table.get("gates", {}), "[validation] gates")
        gates = {}
        for metric, bound in gates_table.items():
            try:
                task.metric(metric)
            except OnnxsmithError as err:
                self.fail(key + ("gates", metric), f"[validation] gates: {err.problem}")
            if isinstance(bound, bool) or not isinstance(bound, (int, float)):
                self.fail(key + ("gates", metric), f"[validation] gate {metric} must be a number")
            gates[metric] = float(bound)
        calibration = table.get("calibration", 4)
        if isinstance(calibration, bool) or not isinstance(calibration, int) or calibration < 1:
            self.fail(key + ("calibration",), "[validation] calibration must be a positive integer")
        return ValidationSpec(task, options, {**task.default_gates, **gates}, calibration)


# ---- where each key is --------------------------------------------------------------------

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def key_lines(text: str) -> dict[KeyPath, int]:
    """The line (1-based) where each key, table and array element of a valid TOML document starts.

    Keys are paths as tomllib's result is indexed: ("variants", 1, "steps", 0, "pass").
    """
    return _Scanner(text).scan()


class _Scanner:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1
        self.found: dict[KeyPath, int] = {}
        self.arrays_of_tables: dict[KeyPath, int] = {}

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def advance(self, n: int = 1) -> None:
        for _ in range(n):
            if self.i < len(self.s):
                if self.s[self.i] == "\n":
                    self.line += 1
                self.i += 1

    def record(self, key: KeyPath, line: int) -> None:
        self.found.setdefault(key, line)

    def skip(self, newlines: bool) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.advance()
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                return

    def string(self) -> str:
        """Consume a string literal; return it decoded."""
        start = self.i
        quote = self.peek()
        triple = self.s.startswith(quote * 3, self.i)
        self.advance(3 if triple else 1)
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\" and quote == '"':
                self.advance(2)
            elif triple and self.s.startswith(quote * 3, self.i):
                self.advance(3)
                while self.peek() == quote:  # up to two quotes may close the content
                    self.advance()
                break
            elif not triple and c == quote:
                self.advance()
                break
            else:
                self.advance()
        raw = self.s[start : self.i]
        try:
            return tomllib.loads(f"k = {raw}")["k"]
        except tomllib.TOMLDecodeError:
            return raw

    def key(self) -> list[str]:
        parts = []
        while True:
            self.skip(newlines=False)
            if self.peek() in ('"', "'"):
                parts.append(self.string())
            else:
                start = self.i
                while self.peek() and self.peek() in _BARE:
                    self.advance()
                parts.append(self.s[start : self.i])
            self.skip(newlines=False)
            if self.peek() != ".":
                return parts
            self.advance()

    def resolve(self, keys: list[str]) -> KeyPath:
        out: KeyPath = ()
        for k in keys:
            out += (k,)
            if out in self.arrays_of_tables:
                out += (self.arrays_of_tables[out],)
        return out

    def value(self, path: KeyPath) -> None:
        c = self.peek()
        if c in ('"', "'"):
            self.string()
        elif c == "[":
            self.advance()
            index = 0
            while True:
                self.skip(newlines=True)
                if self.peek() in ("]", ""):
                    self.advance()
                    return
                self.record(path + (index,), self.line)
                self.value(path + (index,))
                index += 1
                self.skip(newlines=True)
                if self.peek() == ",":
                    self.advance()
        elif c == "{":
            self.advance()
            while True:
                self.skip(newlines=True)
                if self.peek() in ("}", ""):
                    self.advance()
                    return
                line = self.line
                keys = self.key()
                for n in range(1, len(keys) + 1):
                    self.record(path + tuple(keys[:n]), line)
                self.advance()  # '='
                self.skip(newlines=False)
                self.value(path + tuple(keys))
                self.skip(newlines=True)
                if self.peek() == ",":
                    self.advance()
        else:
            while self.peek() and self.peek() not in ",]}\n#":
                self.advance()

    def scan(self) -> dict[KeyPath, int]:
        table: KeyPath = ()
        while True:
            self.skip(newlines=True)
            if self.i >= len(self.s):
                return self.found
            line = self.line
            if self.peek() == "[":
                array = self.s.startswith("[[", self.i)
                self.advance(2 if array else 1)
                keys = self.key()
                self.advance(2 if array else 1)
                if array:
                    base = self.resolve(keys[:-1]) + (keys[-1],)
                    index = self.arrays_of_tables.get(base, -1) + 1
                    self.arrays_of_tables[base] = index
                    self.record(base, line)
                    table = base + (index,)
                else:
                    table = self.resolve(keys)
                self.record(table, line)
            else:
                keys = self.key()
                for n in range(1, len(keys) + 1):
                    self.record(table + tuple(keys[:n]), line)
                self.advance()  # '='
                self.skip(newlines=False)
                self.value(table + tuple(keys))
