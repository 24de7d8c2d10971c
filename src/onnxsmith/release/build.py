"""``onnxsmith build``: a recipe in, a validated, benchmarked, carded release folder out.

For each variant: produce it (transforms in order, the transforms' own gate on
the calibration samples), validate it against the source on the task's data
(storage-faithfully for fp16) and gate it; a variant that fails is not
published and the build says why. Then measure activation ranges, benchmark
the source and every published variant, and write the card, the report and
one JSON of all measurements.

The release is assembled in a staging folder beside ``--out`` and swapped in at the end (release/out_folder.py:
what ``--out`` may hold, the lock, the swap). Building twice gives byte-identical files, except what is timed:
``measurements.json["bench"]`` and the parts of README.md and report.html
between ``<!-- timed -->`` and ``<!-- /timed -->`` (see :data:`TIMED_START`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.summary import summarize
from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.core.limits import FP16_MAX
from onnxsmith.core.options import to_json as options_json
from onnxsmith.core.version import __version__
from onnxsmith.execution.engine import Engine, make_engine
from onnxsmith.io.files import (
    FileRecord,
    copy_file,
    sha256_file,
    write_file,
    write_text_atomic,
)
from onnxsmith.io.load import load_model
from onnxsmith.probes.channels import residual_channel_peaks
from onnxsmith.probes.ranges import measure_ranges
from onnxsmith.release.bench import bench_models
from onnxsmith.release.card import TIMED_END, TIMED_START, render_card
from onnxsmith.release.out_folder import plain_relative, regular_inside, staged_release
from onnxsmith.release.recipe import (
    CARD,
    CHECKSUMS,
    MEASUREMENTS,
    RECIPE_COPY,
    REPORT,
    Recipe,
    VariantSpec,
)
from onnxsmith.release.report import render_report
from onnxsmith.release.validate import TaskRun, Validation
from onnxsmith.release.variant import Acceptance, Staging, VariantReport, Verification, make_variant
from onnxsmith.runtime.fp16_storage import has_fp16
from onnxsmith.runtime.sizing import inputs_that_run

_TOOLS = ("onnx", "onnxruntime", "onnx-ir", "onnxscript", "numpy")


@dataclass(frozen=True)
class ModelFacts:
    """What a card says of a model's interface and contents (the source's and each variant's)."""

    #: ``{"inputs": [...], "outputs": [...]}``, each ``{"name", "dtype", "dims"}``.
    io: dict[str, list[dict[str, Any]]]
    #: Domain ("ai.onnx" for the default one) -> opset version, as the model imports them.
    opsets: dict[str, int]
    #: The domains its nodes really use (an opset import may be left over), sorted.
    op_domains: list[str]
    params_by_dtype: dict[str, int]

    @classmethod
    def of(cls, model: ir.Model, file_bytes: int) -> ModelFacts:
        summary = summarize(model, top=0, file_bytes=file_bytes)
        return cls(
            io={"inputs": summary.inputs, "outputs": summary.outputs},
            opsets={k or "ai.onnx": v for k, v in summary.opsets.items()},
            op_domains=sorted({op.partition("::")[0] for op in summary.ops if "::" in op}),
            params_by_dtype=summary.params_by_dtype,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "io": self.io,
            "opsets": self.opsets,
            "op_domains": self.op_domains,
            "params_by_dtype": self.params_by_dtype,
        }


@dataclass(frozen=True)
class VariantOutcome:
    """What the build did with one variant of the recipe: the variant's own record (release/variant.py's
    :class:`VariantReport`, staged and judged), the files committed to the release, and whether it was
    published and, if not, why. Its part of measurements.json is :meth:`to_json`."""

    #: The variant as the recipe asks for it.
    variant: VariantSpec
    #: What making it did and measured (a refused variant's too: why it was refused, its validation).
    report: VariantReport
    #: Its files in the release (none where it was not published).
    files: list[FileRecord] = field(default_factory=list)
    #: The made variant's interface and contents; None where the one gate refused it (its model is not read,
    #: and measurements.json then holds only the steps the recipe asked for).
    facts: ModelFacts | None = None
    #: Its largest activation as fp16 holds it (:func:`_variant_peak`); None for a variant holding no fp16.
    peak: dict[str, Any] | None = None
    published: bool = False
    #: Why it was not published ("" when it was).
    reason: str = ""

    @property
    def validation(self) -> Validation | None:
        """The task's validation, where the task's gates judged it (not where the one gate refused it)."""
        return self.report.validation

    @property
    def runtime(self) -> dict[str, str]:
        """The session config entries the variant needs."""
        return self.report.runtime

    def moved(self, old: Path, new: Path) -> VariantOutcome:
        """This outcome with its files' paths under the folder ``old`` made the same paths under ``new``."""
        files = [dataclasses.replace(f, path=new / f.path.relative_to(old)) for f in self.files]
        return dataclasses.replace(self, files=files)

    def to_json(self, release: Path) -> dict[str, Any]:
        """Its part of measurements.json; ``release``: the folder its files' paths are relative to."""
        v, report, facts = self.variant, self.report, self.facts
        data: dict[str, Any] = {
            "name": v.name,
            "file": v.file,
            "description": v.description,
            "published": self.published,
            "reason": self.reason,
        }
        if facts is None:  # the one gate refused it: only what was asked
            data["steps"] = [{"name": s.name, "options": options_json(s.options)} for s in v.steps]
            return data
        data.update(
            {
                "headline": report.headline,
                "steps": [_step_json(r) for r in report.steps],
                "files": [f.to_json(release) for f in self.files],
                "nodes": {"source": report.nodes_before, "variant": report.nodes_after},
                "runtime": report.runtime,
                "verification": _finite_json(report.comparison.to_json()),
                **facts.to_json(),
            }
        )
        if report.remade_after is not None:
            data["remade_after"] = report.remade_after
        if report.validation is not None:
            data["validation"] = report.validation.to_json()
        if self.peak is not None:
            data["peak"] = self.peak
        return data


@dataclass(frozen=True)
class BuildResult:
    out: Path
    measurements: dict[str, Any]
    outcomes: list[VariantOutcome]

    @property
    def failed(self) -> list[VariantOutcome]:
        return [o for o in self.outcomes if not o.published]

    @property
    def ok(self) -> bool:
        """Whether every variant was published."""
        return not self.failed


def default_out(recipe_path: Path) -> Path:
    """release/<the recipe's folder name> for a recipe.toml, else release/<its stem>."""
    name = recipe_path.resolve().parent.name if recipe_path.name == "recipe.toml" else recipe_path.stem
    return Path("release") / name


def build(
    recipe: Recipe,
    out: str | os.PathLike,
    *,
    progress: Callable[[str], None] = lambda _: None,
    log: Callable[[str], None] = lambda _: None,
    bench: bool = True,
    force: bool = False,
) -> BuildResult:
    """Build ``recipe`` into the folder ``out``; ``bench=False`` skips the (timed) benchmark.

    ``out`` may be missing, empty, or an earlier release; ``force`` also lets it hold files
    no build made (a git checkout, notes), which are then kept: only the files of the
    earlier release are replaced, one by one instead of the folder as a whole.
    """
    with staged_release(recipe, out, force) as staged:
        result = _build_into(recipe, staged.release, progress, log, bench)
        progress(f"moving the release into {staged.out}")
        staged.install()
    for note in recipe.notes:  # after the work: a refusal stays one line
        log(note)
    outcomes = [o.moved(staged.release, staged.out) for o in result.outcomes]  # their files where the release now is
    return dataclasses.replace(result, out=staged.out, outcomes=outcomes)


def _build_into(recipe: Recipe, release: Path, progress, log, run_bench: bool) -> BuildResult:
    """The release made in ``release``, its validation's samples run where ``[execution]`` says."""
    with make_engine(recipe.execution) as engine:
        return _build_on(recipe, release, progress, log, run_bench, engine)


def _build_on(recipe: Recipe, release: Path, progress, log, run_bench: bool, engine: Engine) -> BuildResult:
    prepared = prepare(recipe, progress, log, engine)
    outcomes = []
    for i in range(len(recipe.variants)):
        outcome = make_one_variant(recipe, i, release, prepared, progress, engine)
        outcomes.append(outcome)
        log(outcome_line(outcome))
    return finish(recipe, release, prepared, outcomes, progress, run_bench)


@dataclass(frozen=True)
class Prepared:
    """What every variant of a recipe is made and judged with: the feeds its transforms measure the source on
    (the task's first samples, or plausible ones without a task) and the task's run (None: no [validation])."""

    feeds: list[dict[str, np.ndarray]]
    task_run: TaskRun | None


def prepare(recipe: Recipe, progress, log, engine: Engine) -> Prepared:
    """The task's samples and the calibration feeds; the samples run on ``engine``."""
    if not recipe.validation:
        return Prepared(inputs_that_run(load_model(recipe.source), samples=4), None)
    spec = recipe.validation
    task_run = TaskRun(
        spec.task, spec.options, recipe.source, progress=progress, execution=recipe.execution, engine=engine
    )
    log(f"validation data: {task_run.data}" + ("" if engine.name == "local" else f" (on {engine.describe()})"))
    return Prepared(task_run.calibration_feeds(spec.calibration), task_run)


def make_one_variant(
    recipe: Recipe, index: int, release: Path, prepared: Prepared, progress, engine: Engine | None = None
) -> VariantOutcome:
    """The recipe's ``index``-th variant made, judged and (if it passes) committed into ``release``."""
    variant = recipe.variants[index]
    prefix = f"[{index + 1}/{len(recipe.variants)}] {variant.name}: "

    def step_progress(message: str) -> None:
        progress(prefix + message)

    return _make_variant(recipe, variant, release, prepared.feeds, prepared.task_run, step_progress, engine)


def outcome_line(outcome: VariantOutcome) -> str:
    """What became of a variant, in a line: published (with its gated metrics) or not and why."""
    variant = outcome.variant
    if not outcome.published:
        return f"not published {variant.name}: {outcome.reason}"
    summary = ""
    if outcome.validation is not None:
        summary = "; " + ", ".join(f"{m.label} {m.display}" for m in outcome.validation.metrics if m.gate is not None)
    return f"published {variant.name} ({variant.file}{summary})"


def finish(
    recipe: Recipe, release: Path, prepared: Prepared, outcomes: list[VariantOutcome], progress, run_bench: bool
) -> BuildResult:
    """The release completed around its variants' ``outcomes`` (their files in ``release``): the source's
    ranges, the benchmark, the included files, SHA256SUMS, measurements.json, the card and the report."""
    source, feeds, task_run = recipe.source, prepared.feeds, prepared.task_run
    source_model = load_model(source)
    published = [o for o in outcomes if o.published]
    progress("measuring the source's activation ranges")
    ranges = _source_ranges(source, feeds[:2])
    bench = _bench(recipe, release, published, task_run, progress) if recipe.bench and published and run_bench else None
    if bench is not None:  # how long validating took: timed too
        bench["validation"] = [_validation_time(o) for o in outcomes if o.validation is not None]
    included = _include(recipe, release, published)
    measurements = {
        "onnxsmith": __version__,
        "tools": _tool_versions(),
        "card": {
            "title": recipe.card.title or source.stem,
            "description": recipe.card.description,
            "homepage": recipe.card.homepage,
            "license": recipe.license_text(),
        },
        "source": {
            "file": source.name,
            "bytes": source.stat().st_size,
            "sha256": recipe.source_sha256,
            **ModelFacts.of(source_model, source.stat().st_size).to_json(),
        },
        "validation": None
        if task_run is None
        else {
            "task": task_run.task.name,
            "summary": task_run.task.summary,
            "data": task_run.data,
            "samples": len(task_run.samples),
            "gates": recipe.validation.gates,
            "calibration_samples": len(feeds),
            # paths as the recipe wrote them: the same bytes however the recipe was named (relative, absolute)
            "options": {
                k: recipe.validation.written.get(k, v) for k, v in options_json(recipe.validation.options).items()
            },
        },
        "variants": [o.to_json(release) for o in outcomes],
        "included": included,
        # taken from outside the recipe's folder (allow_outside = true): the card says so
        "outside_recipe": recipe.outside,
        "ranges": ranges,
        "bench": bench,
    }
    progress("writing the card and the report")
    write_file(release / MEASUREMENTS, (json.dumps(measurements, indent=1, allow_nan=False) + "\n").encode("utf-8"))
    write_file(release / CARD, render_card(measurements).encode("utf-8"))
    write_file(release / REPORT, render_report(measurements).encode("utf-8"))
    return BuildResult(release, measurements, outcomes)


def _bench(recipe: Recipe, release: Path, published: list, task_run: TaskRun | None, progress) -> dict:
    """The source and every published variant timed side by side, with the settings and the machine."""
    models = [("source", recipe.source, {})] + [
        (o.variant.name, release / o.variant.file, o.runtime) for o in published
    ]
    samples = None if task_run is None else task_run.loaded(max(recipe.bench.batches))
    run = bench_models(
        models, recipe.bench, inputs=None if samples is None else partial(_stacked, samples), progress=progress
    )
    settings = {
        "batch": recipe.bench.batches,
        "provider": recipe.bench.provider,
        "runs": recipe.bench.runs,
        "warmup": recipe.bench.warmup,
        "threads": recipe.bench.threads,
        "machine": _machine(),
    }
    return {"settings": settings, **run.to_json()}


def _validation_time(outcome: VariantOutcome) -> dict[str, Any]:
    validation = outcome.validation
    assert validation is not None
    return {
        "variant": outcome.variant.name,
        "samples": validation.samples,
        "seconds": validation.seconds,
        "ran_on": validation.ran_on,
    }


def _include(recipe: Recipe, release: Path, published: list) -> list[dict]:
    """The recipe's included files copied in, the checksums of every file and the recipe written beside them."""
    included = []
    for path in recipe.include:
        copy_file(path, release / path.name)
        shutil.copymode(path, release / path.name)  # a private file stays private
        included.append(FileRecord.of(release / path.name).to_json(release))
    files = [f.to_json(release) for o in published for f in o.files] + included
    checksums = "".join(f"{f['sha256']}  {f['path']}\n" for f in files)
    write_file(release / CHECKSUMS, checksums.encode("utf-8"))
    write_file(release / RECIPE_COPY, recipe.text.encode("utf-8"))
    return included


def _make_variant(
    recipe: Recipe,
    variant: VariantSpec,
    release: Path,
    feeds,
    task_run: TaskRun | None,
    progress,
    engine: Engine | None = None,
) -> VariantOutcome:
    """The variant ``variant`` asks for, made, judged by the one gate and the task's gates (one repair loop:
    release/variant.py) and committed to the release only when both pass; calibration statistics measured on
    ``engine`` (the build's [execution])."""
    target = release / variant.file
    target.parent.mkdir(parents=True, exist_ok=True)
    steps = [(s.name, s.options) for s in variant.steps]
    real = task_run is not None and task_run.real_inputs
    verification = Verification(feeds, gate=variant.gate, real_inputs=real, engine=engine)
    gates = _task_gates(recipe, task_run, feeds, variant.name, progress)
    staged = make_variant(recipe.source, steps, verification, Staging(target), progress, acceptance=gates)
    report = staged.report
    reason = ""
    if not report.passed:
        again = f" (made again after: {report.remade_after})" if report.remade_after else ""
        reason = f"{report.failure}{again}"
    try:
        if report.validation is None and not report.passed:  # the one gate refused it: only what was asked
            return VariantOutcome(variant, report, reason=reason)
        files = staged.commit(target) if report.passed else []
        model = load_model(target if report.passed else staged.staged.path)
    finally:
        staged.discard()
    facts = ModelFacts.of(model, report.bytes)
    if not report.passed:
        if target.parent != release and not any(target.parent.iterdir()):
            target.parent.rmdir()
        return VariantOutcome(variant, report, files, facts, reason=reason)
    peak = None
    if has_fp16(model):  # an fp32 variant holds its values as the source does
        progress("measuring activation ranges as fp16 holds them")
        peak = _variant_peak(target, feeds[:2])
    return VariantOutcome(variant, report, files, facts, peak, published=True)


def _task_gates(recipe: Recipe, task_run: TaskRun | None, feeds, name: str, progress) -> Acceptance | None:
    """The task's gates on real data, as what variant ``name`` must pass beyond the one gate (None: no task);
    a refusal is measured on the calibration feeds by the steps that repair."""
    if task_run is None or recipe.validation is None:
        return None
    gates = recipe.validation.gates

    def validate(path: Path) -> Validation:
        progress("validating")
        return task_run.validate(path, gates, name=name)

    return Acceptance(validate, lambda path: task_run.judge(gates, len(feeds), path))


def _stacked(samples, batch: int) -> dict[str, np.ndarray]:
    """A batch of ``batch`` samples' feeds (cycling through them), stacked on axis 0."""
    chosen = [samples[i % len(samples)].feeds for i in range(batch)]
    return {k: np.concatenate([c[k] for c in chosen]) for k in chosen[0]}


def _variant_peak(path: Path, feeds) -> dict:
    """An fp16 variant's largest activation as a GPU will hold it (storage-faithful)."""
    ranges = measure_ranges(path, feeds)
    top = max(ranges, key=lambda r: r.absmax)
    return {
        "tensor": top.name,
        "node": top.node,
        "absmax": top.absmax,
        "nonfinite": sum(r.nonfinite for r in ranges),
        "storage": "storage-faithful fp16",
        "over_fp16_max": sum(1 for r in ranges if r.absmax > FP16_MAX),
    }


def _source_ranges(source: Path, feeds) -> dict:
    tensors = measure_ranges(source, feeds)
    residual = residual_channel_peaks(source, feeds)
    peak = max(residual, key=lambda p: p.absmax) if residual else None
    return {
        "measured_on": f"{len(feeds)} calibration sample(s)",
        "tensors": [
            {"name": r.name, "order": r.order, "op": r.op_type, "absmax": r.absmax, "nonfinite": r.nonfinite}
            for r in tensors
        ],
        "residual": [
            {
                "tensor": p.tensor,
                "reader": p.reader,
                "order": p.order,
                "absmax": p.absmax,
                "channel": p.channel,
                "top_channels": _top_channels(p.per_channel),
            }
            for p in residual
        ],
        "massive": None
        if peak is None
        else {
            "tensor": peak.tensor,
            "channel": peak.channel,
            "absmax": peak.absmax,
            "tensors_where_it_peaks": sum(1 for p in residual if p.channel == peak.channel),
            "tensors_over_fp16_max": sum(1 for p in residual if p.absmax > FP16_MAX),
            "residual_tensors": len(residual),
            "per_channel": peak.per_channel,
        },
    }


def _top_channels(per_channel: list[float], k: int = 3) -> list[list]:
    order = np.argsort(-np.asarray(per_channel), kind="stable")[:k]
    return [[int(c), float(per_channel[c])] for c in order]


def _step_json(report) -> dict:
    data = report.to_json()
    return _finite_json({"name": data.pop("step"), **data})


def _finite_json(data):
    """NaN/inf are not JSON: write them as null, recursively."""
    if isinstance(data, float):
        return data if np.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite_json(v) for v in data]
    return data


def _tool_versions() -> dict[str, str]:
    versions = {"onnxsmith": __version__, "python": platform.python_version()}
    for name in _TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}"


def rewrite_card(release: Path, card_fields: dict | None = None) -> FileRecord:
    """Re-render README.md from measurements.json after checking the files it pins are unchanged."""
    path = release / MEASUREMENTS
    if not path.is_file():
        raise UsageError("is not an onnxsmith release (no measurements.json)", release)
    measurements = _read_measurements(path)
    pinned = [f for v in measurements["variants"] for f in v.get("files", [])] + measurements.get("included", [])
    for f in pinned:
        file = release / f["path"]
        if not plain_relative(f["path"]):  # the card pins only the release's own files
            raise InputError(f"lists '{f['path']}', which is not a path inside the release folder", path)
        if not os.path.lexists(file):
            raise UsageError(f"the release's file {f['path']} is missing", release)
        if not regular_inside(release, f["path"]):  # a link (out of the folder, maybe) or not a file
            raise InputError(f"lists '{f['path']}', which is a link or not a regular file in the release", path)
        if file.stat().st_size != f["bytes"] or sha256_file(file) != f["sha256"]:
            raise UsageError(
                f"{f['path']} changed since the build (its sha256 differs from the one measured); rebuild instead",
                release,
            )
    if card_fields:
        measurements["card"].update(card_fields)
    try:
        card = render_card(measurements)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:  # hand-edited, not as built
        problem = f"{type(err).__name__}: {' '.join(str(err).split())}"
        raise InputError(f"is not a measurements.json as onnxsmith build writes it ({problem})", path) from None
    if card_fields:
        write_text_atomic(path, json.dumps(measurements, indent=1, allow_nan=False) + "\n")
    return write_text_atomic(release / CARD, card)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _read_measurements(path: Path) -> dict:
    """A release's measurements.json, checked as far as the card's files depend on it: one-line errors naming it."""
    try:
        measurements = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise InputError(f"is not JSON ({' '.join(str(err).split())})", path) from None
    problem = _measurements_problem(measurements)
    if problem:
        raise InputError(f"is not a measurements.json as onnxsmith build writes it: {problem}", path)
    return measurements


def _measurements_problem(m) -> str | None:
    """What is wrong with the parts of ``m`` the card's files come from; None if nothing."""
    if not isinstance(m, dict):
        return f"expected an object, got {type(m).__name__}"
    for key, kind in (("variants", list), ("card", dict), ("source", dict), ("tools", dict)):
        if not isinstance(m.get(key), kind):
            return f"'{key}' must be {'a list' if kind is list else 'an object'}"
    if not isinstance(m.get("included", []), list):
        return "'included' must be a list"
    for i, v in enumerate(m["variants"]):
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not isinstance(v.get("files", []), list):
            return f"variants[{i}] must be an object with a name and a list of files"
    entries = [f for v in m["variants"] for f in v.get("files", [])] + m.get("included", [])
    for f in entries:
        if not (
            isinstance(f, dict)
            and isinstance(f.get("path"), str)
            and isinstance(f.get("bytes"), int)
            and isinstance(f.get("sha256"), str)
            and _SHA256.fullmatch(f["sha256"])
        ):
            return f"a file entry must be {{path, bytes, sha256}}, got {json.dumps(f)[:80]}"
    return None


def strip_timed(text: str) -> str:
    """``text`` without its timed sections (what must be identical between two builds)."""
    out, rest = [], text
    while TIMED_START in rest:
        before, _, after = rest.partition(TIMED_START)
        out.append(before)
        rest = after.partition(TIMED_END)[2]
        rest = rest[1:] if rest.startswith("\n") else rest
    out.append(rest)
    return "".join(out)
