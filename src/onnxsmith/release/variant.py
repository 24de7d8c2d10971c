"""From a source file to a verified variant on disk: :func:`produce_variant`.

The one path every transform command and ``build`` take: load, apply the
transforms (:mod:`onnxsmith.transforms`) in order, stage the result beside its
destination, judge it against the source — every output compared
(storage-faithfully for fp16), or by the gate of the task a transform names
(:attr:`~onnxsmith.core.transform.Transform.gate_task`) — and only then move it
into place. A failed gate writes nothing.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsmith.core.errors import GateFailed
from onnxsmith.core.transform import Progress, StepReport, Transform, TransformContext
from onnxsmith.io.files import FileRecord, sha256_file
from onnxsmith.io.load import load_model, source_files
from onnxsmith.io.paths import check_output
from onnxsmith.io.save import Provenance, save_model, staged_model
from onnxsmith.irutil.walk import all_nodes
from onnxsmith.tasks import get_task
from onnxsmith.transforms import get_transform
from onnxsmith.verify.compare import Comparison, compare_models
from onnxsmith.verify.diagnose import first_nonfinite


def _quiet(_: str) -> None:
    pass


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
    protect = source_files(model, source)
    check_output(output, protect=protect)  # before any work
    # The provenance stamp needs the source's sha256: hash it beside the transforms (hashlib
    # releases the GIL), not after them; a 1 GB source takes a second.
    with ThreadPoolExecutor(max_workers=1) as hashing:
        source_sha256 = hashing.submit(sha256_file, source)
        nodes_before = count_nodes(model)
        context = TransformContext(source_path=source, feeds=feeds, save=save_model, progress=progress)
        reports: list[StepReport] = []
        tolerances = []
        judge: tuple[Transform, Any] | None = None  # the last step whose variants a task's gate judges
        for index, (name, options) in enumerate(steps):
            context.model_is_source = index == 0
            transform = get_transform(name)
            if transform.gate_task is not None:
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
    with staged_model(model, output, provenance=provenance, external_data=external_data, protect=protect) as staged:
        progress("verifying against the source")
        comparison = _judge(judge, context, source, staged.path, gate_feeds, atol=atol, rtol=rtol)
        comparison.candidate = output.name
        if not comparison.passed:
            raise GateFailed(_gate_message(comparison, staged.path, gate_feeds or feeds), output)
        files = staged.commit()
    return VariantResult(files, reports, comparison, nodes_before, nodes_after)


def _judge(
    judge: tuple[Transform, Any] | None,
    context: TransformContext,
    source: Path,
    candidate: Path,
    gate_feeds: list[dict[str, np.ndarray]] | None,
    *,
    atol: float,
    rtol: float,
) -> Comparison:
    """The gate: the named task's (``Transform.gate_task``), else every output within atol/rtol.

    The source is not run again when a step computed its outputs on the calibration
    feeds and the gate runs on those same feeds (``gate_feeds`` None).
    """
    if judge is not None:
        transform, options = judge
        task = get_task(transform.gate_task)
        return task.gate(source, candidate, gate_feeds or context.feeds, **transform.gate_settings(options))
    reference = context.reference if gate_feeds is None else None
    if reference is not None:
        return compare_models(
            source,
            candidate,
            context.feeds,
            atol=atol,
            rtol=rtol,
            reference_outputs=reference.outputs,
            reference_mode=reference.mode,
        )
    return compare_models(source, candidate, gate_feeds or context.feeds, atol=atol, rtol=rtol)


def _gate_message(comparison: Comparison, staged_path: Path, feeds) -> str:
    reasons = "; ".join(comparison.failures())
    culprit = ""
    if any(o.nonfinite_test > o.nonfinite_ref for o in comparison.outputs):
        found = first_nonfinite(staged_path, feeds[0])
        if found is not None:
            culprit = f"; the first non-finite tensor is '{found.tensor}' (from {found.node})"
    return f"verification failed, variant not written: {reasons}{culprit}"
