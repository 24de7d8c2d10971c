"""From a source file to a verified variant: :func:`make_variant`, then :meth:`StagedVariant.commit`.

The one path every transform command, the API and ``build`` take: load, apply the
transforms (:mod:`onnxsmith.transforms`) in order, stage the result in a private
folder (beside its destination when that is known), judge it against the source —
every output by the one gate (:mod:`onnxsmith.verify.gate`: bounds scaled by the number
format the variant differs from its source in; storage-faithfully for fp16), or by the
gate of the task a transform names for it (:meth:`~onnxsmith.core.transform.Transform.gate_task_for`)
— and only then move it into place. When the one gate refuses a variant that a step can
make more exact (``fp16``, ``fuse --precision fp16``: :mod:`onnxsmith.precision.repair`), the
chain is made once more with the gate handed to the steps (``TransformContext.judge``), which
measure with it what to keep fp32; that variant is judged as any. The same loop serves what a
variant must pass besides (:class:`Acceptance`: a build's task gates on real data), judged on the
staged variant before anything is committed. :class:`VariantReport` is the one record of what was
made and measured. :func:`produce_variant` does all of it and writes nothing when refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.lm_signature import cache_layout
from onnxsmith.analysis.number_formats import FORMATS, NumberFormat, formats_of
from onnxsmith.core.errors import GateFailed
from onnxsmith.core.transform import JobEngine, Judge, Progress, StepReport, StructuredJudge, TransformContext
from onnxsmith.io.files import FileRecord, PrivateFolder, sha256_file, staging_dir
from onnxsmith.io.load import load_model, source_files
from onnxsmith.io.paths import check_output
from onnxsmith.io.save import Provenance, StagedModel, save_model, stage_model
from onnxsmith.irutil.walk import all_nodes
from onnxsmith.release.headline import headline
from onnxsmith.release.validate import Validation
from onnxsmith.runtime.runner import NATIVE
from onnxsmith.tasks import get_task, lm
from onnxsmith.transforms import get_transform
from onnxsmith.verify.compare import Comparison, compare_models
from onnxsmith.verify.diagnose import first_nonfinite
from onnxsmith.verify.gate import Bounds, GateOptions, severity, structured_severity


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class SourceInfo:
    """The model a variant was made from."""

    #: The file read (for a model given in memory: the private copy it was written to).
    path: Path
    #: The name stamped into the variant's provenance.
    name: str
    bytes: int
    sha256: str
    #: Where a source that was not a file came from ("an onnx_ir.Model in memory"); None for a file.
    origin: str | None = None

    @classmethod
    def of(cls, path: Path, files: list[Path], sha256: str, name: str | None = None, origin: str | None = None):
        """The source at ``path``, which reads ``files`` (its .onnx and data files: its size)."""
        return cls(path, name or path.name, sum(f.stat().st_size for f in files), sha256, origin)

    def provenance(self, reports: list[StepReport]) -> Provenance:
        """The stamp of a variant made from this source by the steps of ``reports``."""
        steps = [{"name": r.step, "options": r.options} for r in reports]
        return Provenance(self.name, self.sha256, steps, origin=self.origin)

    def to_json(self) -> dict:
        data = {"file": self.name, "bytes": self.bytes, "sha256": self.sha256}
        if self.origin is not None:
            data["origin"] = self.origin
        return data


@dataclass
class Source:
    """The model a variant is made from, read once: its file, the files it reads (no output may replace them),
    the number formats it holds, and the model as loaded, which the first chain made from it takes (a chain
    made again reads the file again: the first changed its copy)."""

    path: Path
    files: list[Path]
    formats: frozenset[NumberFormat]
    loaded: ir.Model | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def read(cls, path: str | os.PathLike) -> Source:
        path = Path(path)
        model = load_model(path)
        return cls(path, source_files(model, path), formats_of(model), model)

    def take(self) -> ir.Model:
        """The model to transform: the one read, the first time; read from the file again after that."""
        model, self.loaded = self.loaded, None
        return model if model is not None else load_model(self.path)


@dataclass(frozen=True)
class VariantReport:
    """What making a variant did and measured, headline first: the one record of a made variant, staged or
    committed (``onnxsmith.Report``; what a build publishes is made from it)."""

    #: The first lines: what was achieved (size vs the source, nodes, the verdict with its key number), then
    #: why not more, in the transforms' own words (release/headline.py).
    headline: list[str]
    source: SourceInfo
    #: What each transform did: notes, stats, tables, the session options the variant needs.
    steps: list[StepReport]
    nodes_before: int
    nodes_after: int
    #: The variant's bytes (its .onnx and data file).
    bytes: int
    #: The one gate's (or the named task's) metrics, per output.
    comparison: Comparison
    #: Why it was refused (one line): by the gate, or by what else it had to pass (a build's task gates).
    failure: str | None = None
    #: The task's validation, where a build's task gates judged it (:class:`Acceptance`).
    validation: Validation | None = None
    #: Why the first variant made was refused, when this one was made again with the gate handed to the steps.
    remade_after: str | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None

    @property
    def size_ratio(self) -> float:
        return self.bytes / self.source.bytes

    @property
    def runtime(self) -> dict[str, str]:
        """The session config entries the variant needs (e.g. ``session.disable_quant_qdq``)."""
        return {k: v for step in self.steps for k, v in step.runtime.items()}

    def __str__(self) -> str:
        lines = list(self.headline)
        for step in self.steps:
            lines += [f"{step.step}: {note}" for note in step.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "headline": self.headline,
            "source": self.source.to_json(),
            "nodes": {"before": self.nodes_before, "after": self.nodes_after},
            "bytes": self.bytes,
            "steps": [step.to_json() for step in self.steps],
        }


@dataclass(frozen=True)
class VariantResult:
    """A variant on disk: its files and its record."""

    files: list[FileRecord]
    report: VariantReport

    # What callers of produce_variant read most, by its usual name.
    @property
    def reports(self) -> list[StepReport]:
        return self.report.steps

    @property
    def comparison(self) -> Comparison:
        return self.report.comparison

    @property
    def nodes_before(self) -> int:
        return self.report.nodes_before

    @property
    def nodes_after(self) -> int:
        return self.report.nodes_after

    @property
    def headline(self) -> list[str]:
        return self.report.headline


@dataclass(frozen=True)
class StagedVariant:
    """A variant made and judged against its source; its files wait in a private folder.

    :meth:`commit` moves them into place (a refused variant too: the caller decides);
    :meth:`discard` removes whatever was not committed. Nothing here holds the model in memory.
    """

    report: VariantReport
    staged: StagedModel
    folder: PrivateFolder

    @property
    def passed(self) -> bool:
        return self.report.passed

    @property
    def failure(self) -> str | None:
        return self.report.failure

    def commit(self, output: str | os.PathLike | None = None, *, alongside=None) -> list[FileRecord]:
        """Put the variant at ``output`` (default: where it was staged for), and ``alongside`` (a report)
        with it; see ``StagedModel.commit``."""
        return self.staged.commit(output, alongside=alongside)

    def discard(self) -> None:
        self.folder.close()

    def result(self, files: list[FileRecord]) -> VariantResult:
        return VariantResult(files, self.report)


def count_nodes(model: ir.Model) -> int:
    return sum(1 for _ in all_nodes(model))


def produce_variant(
    source: str | os.PathLike,
    output: str | os.PathLike,
    steps: list[tuple[str, Any]],
    *,
    progress: Progress = _quiet,
    **verification,
) -> VariantResult:
    """Apply ``steps`` ((transform name, options) pairs) to ``source`` and write a verified ``output``.

    ``verification``: the fields of :class:`Verification` (``feeds``, ``gate_feeds``, ``gate``). Raises
    :class:`GateFailed` (nothing written) when an output is non-finite or outside the gate's bounds.
    """
    variant = make_variant(source, steps, Verification(**verification), Staging(Path(output)), progress)
    return variant.result(commit_verified(variant, output))


def commit_verified(variant: StagedVariant, output: str | os.PathLike) -> list[FileRecord]:
    """Commit ``variant`` to ``output`` if it passed its gate, else raise :class:`GateFailed`;
    either way nothing staged is left behind."""
    try:
        if not variant.passed:
            raise GateFailed(variant.failure, output)
        return variant.commit(output)
    finally:
        variant.discard()


@dataclass(frozen=True)
class Verification:
    """What a variant is calibrated and judged on, and the bounds it must meet.

    ``feeds`` calibrate the transforms; ``gate_feeds`` (default: the same) are what the variant
    is judged on; ``gate``: the bounds a user set (the others follow the number format the
    variant differs in, :mod:`onnxsmith.verify.gate`). ``judge``: a gate beyond the one gate, known before
    any variant was made, handed to the steps that repair (``TransformContext.judge``) from the first make
    on (a gate learnt from a refusal is :func:`make_variant`'s repair loop's, :class:`Acceptance`). ``real_inputs``: the feeds are
    real data, not random from the input spec (``TransformContext.real_inputs``); ``plausible_inputs``: made up,
    but for what each input is (``TransformContext.plausible_inputs``); ``guessed_ranges``, ``unlike_real`` and
    ``range_feeds``: see :class:`TransformContext`.
    """

    feeds: list[dict[str, np.ndarray]]
    gate_feeds: list[dict[str, np.ndarray]] | None = None
    gate: GateOptions = dataclasses.field(default_factory=GateOptions)
    judge: Judge | None = None
    real_inputs: bool = False
    plausible_inputs: bool = False
    guessed_ranges: tuple[str, ...] = ()
    unlike_real: tuple[str, ...] = ()
    range_feeds: list[dict[str, np.ndarray]] | None = None
    #: What each input was taken to be (analysis/input_roles.py), where onnxsmith made or converted the inputs.
    inputs: tuple[str, ...] = ()
    #: Where calibration statistics are measured (``TransformContext.engine``; None: this process).
    engine: JobEngine | None = None

    @property
    def judged_on(self) -> list[dict[str, np.ndarray]]:
        return self.gate_feeds or self.feeds

    def context(
        self,
        source: Path,
        progress: Progress,
        judge: Judge | None = None,
        structured_judge: StructuredJudge | None = None,
    ) -> TransformContext:
        """What the steps get: these feeds, and ``judge`` (a remake after a refusal) or this one's;
        ``structured_judge``: :attr:`TransformContext.structured_judge`."""
        return TransformContext(
            source_path=source,
            feeds=self.feeds,
            save=save_model,
            progress=progress,
            judge=judge or self.judge,
            structured_judge=structured_judge,
            real_inputs=self.real_inputs,
            plausible_inputs=self.plausible_inputs,
            guessed_ranges=self.guessed_ranges,
            unlike_real=self.unlike_real,
            range_feeds=self.range_feeds,
            scratch=lambda: staging_dir(tempfile.gettempdir()),  # removed by a later run if this one is killed
            engine=self.engine,
        )


@dataclass(frozen=True)
class Staging:
    """Where a variant is staged and what its files say of their source.

    ``output``: the destination, when known: checked before any work, and the variant is
    staged beside it (a commit is a rename); else it is staged in the system's temporary
    folder. ``external_data``: True forces a data file, None decides by size. ``source_name``
    and ``origin``: what the provenance says of a source given in memory (the file read is
    then its private copy).
    """

    output: Path | None = None
    external_data: bool | None = None
    source_name: str | None = None
    origin: str | None = None

    @property
    def folder(self) -> Path:
        """Where the private staging folder goes."""
        return self.output.parent if self.output is not None else Path(tempfile.gettempdir())

    @contextlib.contextmanager
    def stage(
        self, model: ir.Model, name: str, provenance: Provenance, protect: list[Path]
    ) -> Iterator[tuple[PrivateFolder, StagedModel]]:
        """``model`` written as ``name`` in a new private folder, removed if the block raises (else the
        variant's to remove); ``protect``: the files its source reads."""
        folder = PrivateFolder(self.folder)
        try:
            staged = stage_model(
                model,
                folder.path,
                name,
                provenance=provenance,
                external_data=self.external_data,
                protect=protect,
                final=self.output,
            )
            yield folder, staged
        except BaseException:
            folder.close()
            raise


@dataclass(frozen=True)
class Acceptance:
    """What a variant the one gate passed must pass too, before anything is committed (a build's task gates on
    real data), and how the steps that repair are told of it when it refuses."""

    #: The staged variant's file -> its validation.
    validate: Callable[[Path], Validation]
    #: The file it refused -> the refusing gates as a :data:`Judge` of raw outputs (None: none can be measured).
    judge: Callable[[Path], Judge | None]


def staged_variant(
    info: SourceInfo,
    reports: list[StepReport],
    nodes: tuple[int, int],
    comparison: Comparison,
    failure: str | None,
    staged: StagedModel,
    folder: PrivateFolder,
    *,
    what: str,
    inputs: tuple[str, ...] = (),
) -> StagedVariant:
    """A :class:`StagedVariant`, with its size and the headline of its report (``inputs``: what each input
    was taken to be, :attr:`Verification.inputs`)."""
    variant_bytes = sum(path.stat().st_size for path in staged.files())
    lines = headline(
        what=what,
        source_bytes=info.bytes,
        variant_bytes=variant_bytes,
        nodes=nodes,
        comparison=comparison,
        reports=reports,
        inputs=inputs,
    )
    record = VariantReport(lines, info, reports, *nodes, variant_bytes, comparison, failure)
    return StagedVariant(record, staged, folder)


def make_variant(
    source: str | os.PathLike | Source,
    steps: list[tuple[str, Any]],
    verification: Verification,
    staging: Staging,
    progress: Progress = _quiet,
    acceptance: Acceptance | None = None,
) -> StagedVariant:
    """Apply ``steps`` to ``source``, stage the result as ``staging`` says and judge it as ``verification``
    says, then by ``acceptance`` when the one gate passed it; commit nothing.

    The one repair loop: when the gate or the acceptance refuses a variant that a step can make more exact,
    the chain is made once more with the refusing judge handed to the steps (``TransformContext.judge``).
    """
    if not isinstance(source, Source):
        progress(f"loading {Path(source).name}")
        source = Source.read(source)
    output = staging.output
    model, protect, source_formats = source.take(), source.files, source.formats
    decoder = cache_layout(model)  # a cached decoder's variant is judged by what it generates too
    if output is not None:
        check_output(output, protect=protect)  # before any work
    # The provenance stamp needs the source's sha256: hash it beside the transforms (hashlib
    # releases the GIL), not after them; a 1 GB source takes a second.
    with ThreadPoolExecutor(max_workers=1) as hashing:
        source_sha256 = hashing.submit(sha256_file, source.path)
        nodes_before = count_nodes(model)
        structured_judge = _structured_judge(steps, verification.gate)
        context = verification.context(source.path, progress, structured_judge=structured_judge)
        reports, settings, task_gate = _apply_steps(model, steps, context, progress)
        info = SourceInfo.of(source.path, protect, source_sha256.result(), staging.source_name, staging.origin)
    bounds = _gate_options(settings, verification.gate)
    name = output.name if output is not None else f"{Path(info.name).stem}_{'_'.join(n for n, _ in steps)}.onnx"
    what = " + ".join(name for name, _ in steps) or "re-saved"
    remakes: list[str] = []  # who refused an earlier make: "gate", "acceptance"
    remade_after = None
    while True:
        progress(f"writing {name}")
        with staging.stage(model, name, info.provenance(reports), protect) as (folder, staged):
            nodes = (nodes_before, count_nodes(model))
            generates = decoder is not None and cache_layout(model) == decoder
            del model  # judged from its file: the weights are not held while the gate runs
            progress("verifying against the source")
            comparison = _judge(
                task_gate, context, source.path, staged.path, verification, bounds, source_formats, generates
            )
            comparison = dataclasses.replace(comparison, candidate=name)
            failure = None if comparison.passed else _gate_message(comparison, staged.path, verification.judged_on)
            # A task's gate says in its summary what it judged on: the made-up inputs' line would describe
            # inputs it did not use (int8 judges a decoder on text the source writes).
            inputs = verification.inputs if task_gate is None else ()
            variant = staged_variant(
                info, reports, nodes, comparison, failure, staged, folder, what=what, inputs=inputs
            )
        variant, repair = _accepted(variant, acceptance, "acceptance" not in remakes, remade_after)
        if variant.passed or task_gate is not None or not repairable(steps):
            return variant
        if repair is not None:
            remakes.append("acceptance")
            progress(f"the task's gates refused it ({variant.failure}): making it again, measured by them")
        elif not comparison.passed and not remakes and context.judge is None:
            remakes.append("gate")
            repair = functools.partial(severity, bounds=comparison.bounds)
            progress("the gate refused it: making it again with the gate handed to the steps that repair")
        else:
            return variant
        # The steps that can keep more of the model exact measure, with the judge that refused it, what to keep
        # (precision/repair.py; int8 quantizes in two passes), and the chain is made once more.
        variant.discard()
        remade_after = variant.failure
        model = source.take()
        context = verification.context(source.path, progress, repair, structured_judge)
        reports, _, _ = _apply_steps(model, steps, context, progress)


def _accepted(
    variant: StagedVariant, acceptance: Acceptance | None, may_repair: bool, remade_after: str | None
) -> tuple[StagedVariant, Judge | None]:
    """``variant`` judged by ``acceptance`` too (when the gate passed it) and, refused so, the judge of what
    refused it (when ``may_repair``); ``remade_after``: why an earlier make was refused."""
    report, repair = dataclasses.replace(variant.report, remade_after=remade_after), None
    if acceptance is not None and report.passed:
        validation = acceptance.validate(variant.staged.path)
        failure = None if validation.passed else "; ".join(validation.failures())
        if failure is not None and may_repair:
            repair = acceptance.judge(variant.staged.path)
        report = dataclasses.replace(report, validation=validation, failure=failure)
    return dataclasses.replace(variant, report=report), repair


def _apply_steps(
    model: ir.Model, steps: list[tuple[str, Any]], context: TransformContext, progress: Progress
) -> tuple[list[StepReport], list[dict[str, Any]], tuple[str, dict[str, Any]] | None]:
    """Apply ``steps`` to ``model`` in place: their reports, what the steps judged by the one gate ask of
    it, and the task whose gate judges the variant, with its settings (the last step's that names one; None:
    the one gate)."""
    reports: list[StepReport] = []
    settings: list[dict[str, Any]] = []
    judge: tuple[str, dict[str, Any]] | None = None
    for index, (name, options) in enumerate(steps):
        context.model_is_source = index == 0
        transform = get_transform(name)
        task = transform.gate_task_for(model, options)
        if task is not None:
            judge = (task, transform.task_gate_settings(options))
        else:
            settings.append(transform.gate_settings(options))
        progress(f"{name}: {transform.summary or 'running'}")
        reports.append(transform.apply(model, options, context))
    return reports, settings, judge


def _structured_judge(steps: list[tuple[str, Any]], given: GateOptions) -> StructuredJudge | None:
    """The gate on structured outputs (:func:`~onnxsmith.verify.gate.structured_severity`) at the bounds the variant will
    be judged by, for a chain with a step that measures with it (:attr:`Transform.measured_as`), else None."""
    formats = [get_transform(name).measured_as for name, _ in steps]
    fmt = next((f for f in formats if f is not None), None)
    if fmt is None:
        return None
    settings = [get_transform(name).gate_settings(options) for name, options in steps]
    bounds = Bounds.for_format(FORMATS[fmt], _gate_options(settings, given))
    return functools.partial(structured_severity, bounds=bounds)


def repairable(steps: list[tuple[str, Any]]) -> bool:
    """Whether a step keeps more of its variant exact when told how the gate measures it
    (:attr:`~onnxsmith.core.transform.Transform.repairs`)."""
    return any(get_transform(name).repairs(options) for name, options in steps)


def _gate_options(settings: list[dict[str, Any]], given: GateOptions) -> GateOptions:
    """The bounds the user set, else the loosest any step asks for (a step that legitimately moves
    its outputs more than its format's rounding, such as int8, says so), else None: from the format."""
    merged: dict[str, float] = {}
    for step in settings:
        for key, value in step.items():
            if value is not None:
                pick = min if key.startswith("min_") else max
                merged[key] = pick(merged.get(key, value), value)
    return GateOptions(**{**merged, **{k: v for k, v in vars(given).items() if v is not None}})


def _judge(
    judge: tuple[str, dict[str, Any]] | None,
    context: TransformContext,
    source: Path,
    candidate: Path,
    verification: Verification,
    bounds: GateOptions,
    source_formats: frozenset[NumberFormat],
    generates: bool = False,
) -> Comparison:
    """The gate: the named task's (``Transform.gate_task_for``) with its settings, else the one gate on every output.

    The source is not run again when a step computed its outputs on the calibration
    feeds and the gate runs on those same feeds (no ``gate_feeds``). ``generates``: both are causal LMs with a
    KV cache of one layout, so a variant the one gate passed is judged by its greedy generation too.
    """
    if judge is not None:
        task, settings = judge
        return get_task(task).gate(source, candidate, verification.judged_on, **settings)
    reference = context.reference if verification.gate_feeds is None else None
    comparison = compare_models(
        source,
        candidate,
        verification.judged_on,
        min_cosine=bounds.min_cosine,
        rtol=bounds.rtol,
        atol=bounds.atol,
        min_agreement=bounds.min_agreement,
        reference_outputs=None if reference is None else reference.outputs,
        reference_mode=NATIVE if reference is None else reference.mode,
        reference_formats=source_formats,
    )
    if comparison.passed and generates:
        # What a user sees of a decoder is what it generates: judged too, beside its outputs (tasks/lm/gate.py).
        comparison.judgements.append(lm.generation_judgement(source, candidate, bounds.min_generation))
    return comparison


def _gate_message(comparison: Comparison, staged_path: Path, feeds) -> str:
    """The refusal's one line: the verdict and the first non-finite tensor."""
    reasons = comparison.verdict()
    culprit = ""
    if any(o.nonfinite_test > o.nonfinite_ref for o in comparison.outputs):
        found = first_nonfinite(staged_path, feeds[0])
        if found is not None:
            culprit = f"; the first non-finite tensor is '{found.tensor}' (from {found.node})"
    return f"verification failed, variant not written: {reasons}{culprit}"
