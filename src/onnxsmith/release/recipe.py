"""A release recipe: one TOML file that says how a release is built.

::

    [source]
    path = "model.onnx"                      # relative to the recipe
    sha256 = "9f2c…"                         # the build refuses any other file

    [[variants]]
    name = "fused-fp16"                      # written as fused-fp16.onnx (or `file = ...`)
    steps = [{ transform = "fuse", precision = "fp16" }]   # transforms in order, with their options

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
reported as ``recipe.toml:LINE: problem`` (exit 2). tomllib reads the text; one
schema (release/recipe_schema.py, which docs/recipe.md is rendered from) says what
each table and key may hold; release/key_lines.py finds the line of each key.

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
from onnxsmith.io.paths import resolves_outside
from onnxsmith.io.save import data_file_name
from onnxsmith.release.bench import BenchSettings
from onnxsmith.release.key_lines import KeyPath, key_lines
from onnxsmith.release.recipe_schema import OPTIONS, RECIPE, SchemaError, check
from onnxsmith.settings.bench import BenchOptions
from onnxsmith.settings.execution import ExecutionOptions
from onnxsmith.settings.gate import GateOptions
from onnxsmith.tasks import get_task
from onnxsmith.tasks.base import Task

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

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


@dataclass
class Step:
    name: str  # the transform
    options: Any
    line: int | None


@dataclass
class VariantSpec:
    """A variant as the recipe asks for it (what was made of it: release/variant.py's records)."""

    name: str
    file: str
    steps: list[Step]
    description: str = ""
    #: Its own bounds on the one gate (settings/gate.py: the recipe's keys beside ``steps``).
    gate: GateOptions = field(default_factory=GateOptions)
    line: int | None = None


@dataclass
class ValidationSpec:
    task: Task
    options: Any
    gates: dict[str, float]
    #: How many of the task's samples the transforms calibrate on (and their own gate runs on).
    calibration: int = 4
    #: The path options as the recipe wrote them (``options`` holds them resolved against the recipe's folder,
    #: which depends on how the recipe was named): what measurements.json records, the same however it is.
    written: dict[str, Any] = field(default_factory=dict)


@dataclass
class Card:
    title: str = ""
    description: str = ""
    homepage: str = ""


@dataclass
class Recipe:
    path: Path
    text: str
    source: Path
    source_sha256: str
    variants: list[VariantSpec]
    validation: ValidationSpec | None
    bench: BenchSettings | None
    card: Card
    #: Files copied into the release beside the variants (and pinned with them), named as the recipe names them.
    include: list[Path] = field(default_factory=list)
    #: The card's license text (``license``, or what ``license_file`` holds, read when the recipe is).
    license: str = ""
    #: What the release takes from outside the recipe's folder (``allow_outside = true``): include
    #: names, and "license_file" for the license text. The card lists them.
    outside: list[str] = field(default_factory=list)
    #: What the recipe should say otherwise, by line (a deprecated key): the build prints them first.
    notes: list[str] = field(default_factory=list)
    #: Where the validation's samples run (``[execution]``).
    execution: ExecutionOptions = field(default_factory=ExecutionOptions)

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
    """A recipe fitted to the schema, then what the schema cannot see: the source's sha256, the
    gates' metrics, what the release publishes and the names its files take."""

    def __init__(self, path: Path, text: str, data: dict) -> None:
        self.path = path
        self.text = text
        self.data = data
        self.lines = key_lines(text)

    def line(self, key: KeyPath) -> int | None:
        for n in range(len(key), 0, -1):
            if key[:n] in self.lines:
                return self.lines[key[:n]]
        return None

    def fail(self, key: KeyPath, problem: str):
        raise RecipeError(problem, self.path, self.line(key))

    def recipe(self) -> Recipe:
        try:
            checked = check(RECIPE, self.data, self.path.parent)
        except SchemaError as err:
            self.fail(err.key, err.problem)
        values = checked.values
        source = Path(values["source"]["path"])
        sha256 = self.source_sha256(source, values["source"]["sha256"])
        variants = [self.variant(i, v) for i, v in enumerate(values["variants"])]
        validation = self.validation(values["validation"])
        bench = None
        if values["bench"] is not None:
            given = {f.name: values["bench"][f.name] for f in dataclasses.fields(BenchOptions)}
            bench = BenchSettings.of(BenchOptions(**given))
        execution = ExecutionOptions(**values["execution"])
        if execution.shard_dir is not None:
            execution = dataclasses.replace(execution, shard_dir=str(self.path.parent / execution.shard_dir))
        release, card = values["release"], values["card"]
        outside = self.published(checked.published, allow_outside=release["allow_outside"])
        include = [Path(p) for p in release["include"]]
        self.check_layout(variants, include)
        license_text = card["license"]
        if card["license_file"]:
            license_text = self.text_file(("card", "license_file"), Path(card["license_file"]), "[card] license_file")
        return Recipe(
            self.path,
            self.text,
            source,
            sha256,
            variants,
            validation,
            bench,
            Card(card["title"], card["description"], card["homepage"]),
            include,
            license=license_text,
            outside=outside,
            notes=[f"{self.path}:{self.line(at)}: {what}" for at, what in checked.deprecated],
            execution=execution,
        )

    def source_sha256(self, source: Path, expected: str) -> str:
        actual = sha256_file(source)
        if expected.lower() != actual:
            self.fail(
                ("source", "sha256"),
                f"[source] sha256 mismatch: the recipe expects {expected} but {self.data['source']['path']} "
                f"has {actual}",
            )
        return actual

    def variant(self, index: int, values: dict) -> VariantSpec:
        key = ("variants", index)
        steps = [
            Step(step["transform"], step[OPTIONS], self.line(key + ("steps", j)))
            for j, step in enumerate(values["steps"])
        ]
        gate = GateOptions(**{f.name: values[f.name] for f in dataclasses.fields(GateOptions)})
        return VariantSpec(values["name"], values["file"], steps, values["description"], gate, self.line(key))

    def validation(self, values: dict | None) -> ValidationSpec | None:
        if values is None:
            return None
        task = get_task(values["task"])
        for metric in values["gates"]:
            try:
                task.metric(metric)
            except OnnxsmithError as err:
                self.fail(("validation", "gates", metric), f"[validation] gates: {err.problem}")
        raw = self.data.get("validation") or {}
        written = {
            f.name: raw[key]
            for f in dataclasses.fields(values[OPTIONS])
            if f.metadata.get("path")
            for key in dict.fromkeys((f.name, f.name.replace("_", "-")))
            if key in raw
        }
        return ValidationSpec(
            task, values[OPTIONS], {**task.default_gates, **values["gates"]}, values["calibration"], written
        )

    def published(self, files: list[tuple[KeyPath, str, str, Path]], *, allow_outside: bool) -> list[str]:
        """Each file whose contents go into the release is a regular file (after symbolic links) inside
        the recipe's folder, unless the recipe says ``allow_outside = true``: a recipe must not publish
        /etc/shadow by accident. Returns what came from outside, as the card names it."""
        outside = []
        folder = self.path.parent
        for key, what, item, path in files:
            if not path.resolve().is_file():
                self.fail(key, f"{what}: '{item}' is not a regular file")
            real = resolves_outside(path, folder)
            if real is not None:
                if not allow_outside:
                    self.fail(
                        key,
                        f"{what}: '{item}' resolves to {real}, outside the recipe's folder; only files inside it "
                        "are published, unless [release] says allow_outside = true",
                    )
                outside.append(path.name if key[0] == "release" else key[-1])
        return outside

    def check_layout(self, variants: list[VariantSpec], include: list[Path]) -> None:
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
