"""Transforms: the user-facing operations (fp16, fuse, quantize, shrink, ...).

A transform turns an in-memory model into a variant and reports what it did. It
is built from IR passes (:mod:`onnxsmith.passes`) and may measure the source
first (calibration). Its options are a dataclass, so the CLI flags and a
recipe's keys come from one definition (:mod:`onnxsmith.pipeline.options`).

:func:`produce_variant` is the one path from a source file to a verified
variant on disk: load, apply the transforms in order, stage the result beside
its destination, compare it with the source (storage-faithfully for fp16),
and only then move it into place. A failed gate writes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.graph import all_nodes
from onnxsmith.errors import GateFailed, UsageError
from onnxsmith.io.files import FileRecord, sha256_file
from onnxsmith.io.load import load_model
from onnxsmith.io.save import Provenance, save_model, staged_model
from onnxsmith.verify.compare import Comparison, compare_models
from onnxsmith.verify.diagnose import first_nonfinite

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class TransformContext:
    """What a transform may use besides the model."""

    source_path: Path
    #: Input sets to measure the source on (calibration) — random from the input spec unless given.
    feeds: list[dict[str, np.ndarray]]
    progress: Progress = _quiet
    #: Whether the model a step receives is still the source as loaded (the first step of a chain).
    model_is_source: bool = True

    @contextlib.contextmanager
    def model_file(self, model: ir.Model) -> Iterator[Path]:
        """A file holding ``model`` as it is now, for a measurement that runs it.

        The source file itself while the model is still the source (nothing written);
        after an earlier step of a chain, a temporary copy of what that step made: a
        calibration must see the tensors of the graph it converts.
        """
        if self.model_is_source:
            yield self.source_path
            return
        with tempfile.TemporaryDirectory(prefix="onnxsmith-step-") as tmp:
            path = Path(tmp) / self.source_path.name
            save_model(model, path)
            yield path


@dataclass
class StepReport:
    """What one transform did, for the console, the card and the report."""

    step: str
    options: dict[str, Any]
    #: Sentences for the card, e.g. "removed 118 up-casts and 47 orphaned down-casts".
    notes: list[str] = field(default_factory=list)
    #: Numbers worth keeping (nodes before/after, Casts, bytes, ...).
    stats: dict[str, Any] = field(default_factory=dict)
    #: Named tables (lists of rows) such as the fp32 islands with their measured ranges.
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Session options the variant needs at run time, e.g. {"session.disable_quant_qdq": "1"}.
    runtime: dict[str, str] = field(default_factory=dict)
    #: Tables shown only on ``--explain``: each change and why, before/after breakdowns.
    details: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class Transform:
    """Base class: subclasses set ``name``, ``Options`` and implement :meth:`apply`."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    Options: ClassVar[type]

    def apply(self, model: ir.Model, options: Any, context: TransformContext) -> StepReport:
        raise NotImplementedError

    def tolerance(self, options: Any) -> tuple[float, float]:
        """The (atol, rtol) its gate compares outputs with, unless the user sets them."""
        return 1e-4, 1e-3

    def verify(
        self,
        options: Any,
        reference: Path,
        candidate: Path,
        feeds: list[dict[str, np.ndarray]],
        *,
        atol: float,
        rtol: float,
    ) -> Comparison:
        """How the gate judges a variant against its source: by default every output within atol/rtol.

        A transform whose variants legitimately differ (4-bit weights) overrides this with a
        measure that fits, e.g. next-token agreement for a language model.
        """
        return compare_models(reference, candidate, feeds, atol=atol, rtol=rtol)


_REGISTRY: dict[str, type[Transform]] = {}


def register(cls: type[Transform]) -> type[Transform]:
    _REGISTRY[cls.name] = cls
    return cls


def transforms() -> dict[str, type[Transform]]:
    import onnxsmith.transforms  # noqa: F401  (importing registers every transform)

    return dict(_REGISTRY)


def get_transform(name: str) -> Transform:
    known = transforms()
    if name not in known:
        raise UsageError(f"unknown pass '{name}' (known: {', '.join(sorted(known))})")
    return known[name]()


@dataclass
class VariantResult:
    files: list[FileRecord]
    reports: list[StepReport]
    comparison: Comparison
    nodes_before: int
    nodes_after: int


def count_nodes(model: ir.Model) -> int:
    return sum(1 for _ in all_nodes(model))


def produce_variant(
    source: str | os.PathLike,
    output: str | os.PathLike,
    steps: list[tuple[str, Any]],
    *,
    feeds: list[dict[str, np.ndarray]],
    gate_feeds: list[dict[str, np.ndarray]] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    external_data: bool | None = None,
    progress: Progress = _quiet,
) -> VariantResult:
    """Apply ``steps`` ((transform name, options) pairs) to ``source`` and write a verified ``output``.

    ``feeds`` calibrate the transforms; ``gate_feeds`` (default: the same) are what the
    variant is compared on. Raises :class:`GateFailed` (nothing written) when an output
    is non-finite or outside tolerance.
    """
    source = Path(source)
    output = Path(output)
    progress(f"loading {source.name}")
    model = load_model(source)
    # The provenance stamp needs the source's sha256: hash it beside the transforms (hashlib
    # releases the GIL), not after them; a 1 GB source takes a second.
    with ThreadPoolExecutor(max_workers=1) as hashing:
        source_sha256 = hashing.submit(sha256_file, source)
        nodes_before = count_nodes(model)
        context = TransformContext(source_path=source, feeds=feeds, progress=progress)
        reports: list[StepReport] = []
        tolerances = []
        judge: tuple[Transform, Any] | None = None  # the last step with a gate of its own
        for index, (name, options) in enumerate(steps):
            context.model_is_source = index == 0
            transform = get_transform(name)
            if type(transform).verify is not Transform.verify:
                judge = (transform, options)
            progress(f"{name}: {transform.summary or 'running'}")
            reports.append(transform.apply(model, options, context))
            tolerances.append(transform.tolerance(options))
        nodes_after = count_nodes(model)
        provenance = Provenance(
            source_name=source.name,
            source_sha256=source_sha256.result(),
            steps=[{"name": r.step, "options": r.options} for r in reports],
        )
    # A chain is as loose as its loosest step.
    step_atol = max((t[0] for t in tolerances), default=1e-4)
    step_rtol = max((t[1] for t in tolerances), default=1e-3)
    atol = step_atol if atol is None else atol
    rtol = step_rtol if rtol is None else rtol

    progress(f"writing {output.name}")
    with staged_model(model, output, provenance=provenance, external_data=external_data, protect=[source]) as staged:
        progress("verifying against the source")
        if judge is not None:
            comparison = judge[0].verify(judge[1], source, staged.path, gate_feeds or feeds, atol=atol, rtol=rtol)
        else:
            comparison = compare_models(source, staged.path, gate_feeds or feeds, atol=atol, rtol=rtol)
        comparison.candidate = output.name
        if not comparison.passed:
            raise GateFailed(_gate_message(comparison, staged.path, gate_feeds or feeds), output)
        files = staged.commit()
    return VariantResult(files, reports, comparison, nodes_before, nodes_after)


def _gate_message(comparison: Comparison, staged_path: Path, feeds) -> str:
    reasons = "; ".join(comparison.failures())
    culprit = ""
    if any(o.nonfinite_test > o.nonfinite_ref for o in comparison.outputs):
        found = first_nonfinite(staged_path, feeds[0])
        if found is not None:
            culprit = f"; the first non-finite tensor is '{found.tensor}' (from {found.node})"
    return f"verification failed, variant not written: {reasons}{culprit}"
