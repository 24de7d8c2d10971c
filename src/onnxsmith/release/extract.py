"""From a source file and a cut to a verified piece on disk (``onnxsmith extract``).

A piece is not a variant: its inputs and outputs differ from the source's, so
it cannot be compared output for output. It is verified the way it will be
used: the source runs on the sample inputs with the cut tensors exposed as
outputs (weights left in place, see :mod:`onnxsmith.probes.exposed`), those
values are fed to the staged piece, and the piece's outputs must match the
source's values of the same tensors — integers exactly, floats within the one
gate's bounds (verify/gate.py). Only then is the piece moved into place; otherwise nothing is written.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.cut import plan_cut
from onnxsmith.analysis.number_formats import compared_format, formats_of
from onnxsmith.core.errors import GateFailed
from onnxsmith.core.transform import Progress, StepReport
from onnxsmith.io.files import FileRecord, sha256_file
from onnxsmith.io.load import load_model, source_files
from onnxsmith.io.paths import check_output
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.extract import ExtractPass
from onnxsmith.probes.exposed import run_exposed
from onnxsmith.release.variant import (
    SourceInfo,
    StagedVariant,
    Staging,
    Verification,
    commit_verified,
    count_nodes,
    staged_variant,
)
from onnxsmith.runtime import runner
from onnxsmith.verify.compare import Comparison
from onnxsmith.verify.gate import Bounds, GateOptions, judge_all

STEP = "extract"


def _quiet(_: str) -> None:
    pass


@dataclass
class ExtractedPiece:
    """A piece cut from its source, verified and committed (what :func:`extract_piece` returns)."""

    files: list[FileRecord]
    comparison: Comparison
    nodes_source: int
    nodes_piece: int
    initializers: int  # kept in the piece
    initializer_bytes: int
    source_initializer_bytes: int
    typed_by_running: list[str]  # inputs/outputs static inference could not type
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "files": [f.to_json() for f in self.files],
            "nodes": {"source": self.nodes_source, "piece": self.nodes_piece},
            "initializers": {
                "count": self.initializers,
                "bytes": self.initializer_bytes,
                "source_bytes": self.source_initializer_bytes,
            },
            "typed_by_running": self.typed_by_running,
            "notes": self.notes,
            "verification": self.comparison.to_json(),
        }


def extract_piece(
    source: str | os.PathLike,
    output: str | os.PathLike,
    inputs: list[str] | None,
    outputs: list[str],
    *,
    progress: Progress = _quiet,
    **verification,
) -> ExtractedPiece:
    """Write the piece of ``source`` between ``inputs`` and ``outputs`` (tensor names) to ``output``.

    ``verification``: the fields of :class:`~onnxsmith.release.variant.Verification` (``feeds``, ``gate``).
    Raises :class:`GateFailed` (nothing written) when the piece's outputs differ from the source's.
    """
    piece = make_piece(source, inputs, outputs, Verification(**verification), Staging(Path(output)), progress)
    return extracted_piece(piece, commit_verified(piece, output))


def extracted_piece(piece: StagedVariant, files: list[FileRecord]) -> ExtractedPiece:
    """What :func:`extract_piece` returns, from the staged piece's step report."""
    [report] = piece.report.steps
    stats = report.stats
    return ExtractedPiece(
        files=files,
        comparison=piece.report.comparison,
        nodes_source=piece.report.nodes_before,
        nodes_piece=piece.report.nodes_after,
        initializers=stats["initializers"]["count"],
        initializer_bytes=stats["initializers"]["bytes"],
        source_initializer_bytes=stats["initializers"]["source_bytes"],
        typed_by_running=stats["typed_by_running"],
        notes=report.notes,
    )


def make_piece(
    source: str | os.PathLike,
    inputs: list[str] | None,
    outputs: list[str],
    verification: Verification,
    staging: Staging,
    progress: Progress = _quiet,
) -> StagedVariant:
    """Cut, stage and verify the piece; commit nothing (see :func:`~onnxsmith.release.variant.make_variant`).

    ``verification.feeds`` are the source's inputs; the piece is judged on the source's values of
    the cut tensors (``gate_feeds`` are not used). Its one step report ("extract") holds the cut,
    the notes, and in ``stats`` the initializers kept, what was typed by running and the piece's
    inputs and outputs. ``staging.external_data`` None: as the source keeps its weights.
    """
    source = Path(source)
    output = staging.output
    progress(f"loading {source.name}")
    model = load_model(source)
    protect = source_files(model, source)
    if output is not None:
        check_output(output, protect=protect)  # before any work
    if inputs is None:
        everything = [v.name for v in model.graph.inputs if not v.is_initializer()]
        unused = plan_cut(model, everything, outputs, source).unused_inputs
        inputs = [name for name in everything if name not in unused]
    cut = plan_cut(model, inputs, outputs, source)
    model.graph.sort()  # in memory only: extraction copies nodes in graph order
    infer_types(model)  # static types for the cut tensors

    progress("running the source with the cut tensors exposed")
    values = _source_values(model, cut.inputs + cut.outputs, verification.feeds, near=[staging.folder, source.parent])

    static = all(isinstance(d, int) for v in model.graph.inputs if v.shape is not None for d in v.shape)
    extract = ExtractPass(inputs, outputs, observed=values, static_dims=static)(model)
    piece = extract.model
    kept = list(piece.graph.initializers.values())
    report = StepReport(STEP, {"inputs": inputs, "outputs": outputs})
    report.notes += [f"input '{name}' is not read by the requested outputs" for name in cut.unused_inputs]
    if extract.typed_by_running:
        report.notes.append(
            "typed by running the source (static inference could not tell): " + ", ".join(extract.typed_by_running)
        )
    report.stats = {
        "initializers": {
            "count": len(kept),
            "bytes": sum(v.const_value.nbytes for v in kept if v.const_value is not None),
            "source_bytes": sum(
                v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
            ),
        },
        "typed_by_running": extract.typed_by_running,
        "io": {"inputs": _io(piece.graph.inputs), "outputs": _io(piece.graph.outputs)},
    }
    if staging.external_data is None and _has_data_files(model, source):
        # keep the source's layout: weights beside the model, mapped, not parsed
        staging = dataclasses.replace(staging, external_data=True)
    info = SourceInfo.of(source, protect, sha256_file(source), staging.source_name, staging.origin)
    name = output.name if output is not None else f"{Path(info.name).stem}_piece.onnx"
    progress(f"writing {name}")
    with staging.stage(piece, name, info.provenance([report]), protect) as (folder, staged):
        progress("verifying the piece against the source")
        gate = verification.gate
        comparison = _verify(staged.path, piece, cut.inputs, cut.outputs, values, gate, output or Path(name))
        comparison = dataclasses.replace(comparison, reference=f"{info.name} (cut tensors exposed)", candidate=name)
        failure = None
        if not comparison.passed:
            failure = f"verification failed, piece not written: {comparison.verdict()}"
        nodes = (count_nodes(model), count_nodes(piece))
        return staged_variant(info, [report], nodes, comparison, failure, staged, folder, what=STEP)


def _io(values) -> list[dict]:
    """A piece's inputs or outputs as the console shows them: name, dtype, dims ("?" where unknown)."""
    return [
        {
            "name": v.name,
            "dtype": v.dtype.name if v.dtype is not None else "?",
            "dims": [d if isinstance(d, int) else (d.value or "?") for d in v.shape] if v.shape is not None else ["?"],
        }
        for v in values
    ]


def _has_data_files(model: ir.Model, source: Path) -> bool:
    """Whether the source keeps weights in files of their own (not inside the .onnx)."""
    return any(
        isinstance(v.const_value, ir.ExternalTensor) and Path(v.const_value.path).resolve() != source.resolve()
        for graph in model.graphs()
        for v in graph.initializers.values()
    )


def _source_values(
    model: ir.Model, wanted: list[ir.Value], feeds: list[dict[str, np.ndarray]], *, near: list[Path]
) -> dict[str, list[np.ndarray]]:
    """The source's value of every wanted tensor, one array per feed."""
    computed = [v for v in wanted if v.producer() is not None]
    runs = run_exposed(model, computed, feeds, near=near) if computed else [{} for _ in feeds]
    values: dict[str, list[np.ndarray]] = {}
    for value in wanted:
        if value.producer() is not None:
            values[value.name] = [run[value.name] for run in runs]
        elif value.const_value is not None:  # an initializer
            values[value.name] = [value.const_value.numpy() for _ in feeds]
        else:  # a graph input of the source
            values[value.name] = [np.asarray(f[value.name]) for f in feeds]
    return values


def _verify(
    path: Path, piece: ir.Model, inputs, outputs, values: dict[str, list[np.ndarray]], gate: GateOptions, output: Path
) -> Comparison:
    """The piece run on the source's values of its inputs, judged against the source's values of its outputs.

    The piece computes what the source computes there, in the same number formats: the gate's
    bounds are those of the piece's formats (a reordering, not a conversion).
    """
    session = runner.open_session(path)
    input_names = {v.name for v in inputs}
    results: dict[str, list[np.ndarray]] = {}
    samples = len(values[outputs[0].name])
    for i in range(samples):
        feeds = {}
        for value in piece.graph.inputs:
            if value.name in input_names:
                array = values[value.name][i]
                feeds[value.name] = array.astype(value.dtype.numpy()) if value.dtype is not None else array
        for name, array in runner.run(session, feeds, [v.name for v in outputs], label=path).items():
            results.setdefault(name, []).append(array)
    del session
    formats = formats_of(piece)
    bounds = Bounds.for_format(compared_format(formats, formats), gate)
    comparison = Comparison("", "", {"reference": "native", "candidate": "native"}, samples, bounds)
    for value in outputs:
        reference, test = values[value.name], results[value.name]
        if any(r.shape != t.shape for r, t in zip(reference, test)):
            raise GateFailed(
                f"verification failed, piece not written: output '{value.name}' has shape "
                f"{test[0].shape}, the source's {reference[0].shape}",
                output,
            )
    stacked = {value.name: _stack(values[value.name]) for value in outputs}
    comparison.outputs = judge_all(stacked, {value.name: _stack(results[value.name]) for value in outputs}, bounds)
    return comparison


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    """Samples on a leading axis; samples of different shapes (a data-dependent dim) flattened end to end."""
    if len({a.shape for a in arrays}) == 1:
        return np.stack(arrays)
    return np.concatenate([a.ravel() for a in arrays])[None]
