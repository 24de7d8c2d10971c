"""The fuse engine: a transformer graph rewritten into ONNX Runtime's fused contrib operators.

What either torch exporter writes for a ViT or BERT encoder becomes, per block,
SkipLayerNormalization -> three projections -> RotaryEmbedding of q and k ->
MultiHeadAttention -> output projection -> SkipLayerNormalization -> MatMul ->
BiasGelu -> MatMul. ``make_fused`` is what :class:`onnxsmith.transforms.fuse.Fuse` runs. The steps:

1. Shapes (shapes.py, on passes/): the input dims are named; everything computed from
   constants and input shapes is evaluated and folded (fold_shapes), so every
   Reshape has a constant target with -1 for the batch and a fixed-size image
   input needs no Shape/Gather/Concat/Expand at run time; inferred dims get the
   names of the input dims they follow (name_dims) so the rules can compare them.
2. Fusions (fusions.py: rules/, in the order of ``FUSIONS``): each either matches, as often
   as it can, or leaves the graph as it was and says why it did not.
3. Row pruning (passes/prune_rows.py): where the outputs read only some
   tokens (a CLS head), the last block computes only those.
4. Precision: ``fp32`` keeps every type; ``fp16`` runs MatMul, attention, RoPE
   and BiasGelu in fp16 while the residual stream and the LayerNorms stay fp32
   (the precision engine, :mod:`onnxsmith.precision.engine`, on measured ranges).

The words the report shows are report.py's. The result is verified against the source before it is
written (produce_variant).
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import (
    DeduplicateInitializersPass,
    LiftConstantsToInitializersPass,
    RemoveUnusedNodesPass,
    RemoveUnusedOpsetsPass,
)

from onnxsmith.core import options as opts
from onnxsmith.core.transform import StepReport, TransformContext
from onnxsmith.fuse_engine.fusions import FUSIONS, OPSET_NEEDED, apply_fusion, check_no_fusion_ops
from onnxsmith.fuse_engine.report import describe, fold_note, op_counts, opset_note, prune_note
from onnxsmith.fuse_engine.shapes import input_dims, prepare_shapes
from onnxsmith.irutil.types import forget_inferred_types, infer_types, typed_values
from onnxsmith.irutil.walk import all_nodes
from onnxsmith.passes.fold_constants_guarded import FoldConstantsGuardedPass
from onnxsmith.passes.lower_to_opset import LowerToOpsetPass
from onnxsmith.passes.prune_rows import PruneRowsPass
from onnxsmith.passes.raise_opset import default_opset
from onnxsmith.precision import engine as precision_engine
from onnxsmith.precision import report as precision_report
from onnxsmith.precision.engine import PrecisionRecord
from onnxsmith.rules.apply import RuleOutcome
from onnxsmith.settings.fuse import FuseOptions


def make_fused(model: ir.Model, options: FuseOptions, context: TransformContext, name: str = "fuse") -> StepReport:
    """Rewrite ``model`` in place into onnxruntime's fused ops (in fp16 where ``options.precision`` says)."""
    report = StepReport(name, opts.to_json(options))
    counts_before = op_counts(model)
    weights_before = precision_report.weight_bytes_by_type(model)
    stated = typed_values(model)
    input_dims(model, context.feeds[0], options.static_dims)  # names unnamed dims, fixes the static ones
    if options.precision == "fp16":
        _rescale_streams(model, context, report)
    context.progress("fuse: folding shape computations")
    fold, noop = prepare_shapes(model, progress=context.progress)
    report.notes.append(fold_note(fold))
    outcomes = [noop, *_fuse(model, context, report)]
    _settle(model)
    if options.prune_rows:
        _prune_rows(model, report)
    record = _to_fp16(model, context, report) if options.precision == "fp16" else None
    _tidy(model, stated)
    describe(report, model, options, fold, outcomes, record, counts_before, weights_before)
    return report


def _rescale_streams(model: ir.Model, context: TransformContext, report: StepReport) -> None:
    """fp16, before anything renames a value: the residual streams are found by their Adds and measured by name."""
    context.progress("fuse: measuring activation ranges of the source")
    streams = precision_engine.rescale_streams_for_fusion(model, precision_engine.measure(model, context))
    report.notes.extend(precision_report.fused_stream_notes(streams))


def _fuse(model: ir.Model, context: TransformContext, report: StepReport) -> list[RuleOutcome]:
    """Step 2: each of ``FUSIONS`` in turn (a note says so where one raised the model's opset)."""
    opset = default_opset(model)
    outcomes = []
    for name, stages in FUSIONS:
        context.progress(f"fuse: {name}")
        outcomes.append(apply_fusion(model, name, stages))
    if default_opset(model) != opset:
        report.notes.append(opset_note(opset, default_opset(model), OPSET_NEEDED))
    return outcomes


def _settle(model: ir.Model) -> None:
    """After the fusions: what they left unused goes, their forms become the model's opset's, constants fold."""
    RemoveUnusedNodesPass()(model)
    check_no_fusion_ops(model)
    LowerToOpsetPass()(model)  # the rules write Shape(start, end), an opset-15 form
    # What the rewrites left constant (MultiHeadAttention's packed bias is a Concat of the q/k/v
    # biases) is folded, under the rule that nothing grows the file.
    FoldConstantsGuardedPass()(model)
    LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)


def _prune_rows(model: ir.Model, report: StepReport) -> None:
    """Step 3: where the outputs read only some tokens (a CLS head), the last block computes only those."""
    infer_types(model)
    prune = PruneRowsPass()(model)
    if prune.pruned:
        report.notes.append(prune_note(prune.pruned))


def _to_fp16(model: ir.Model, context: TransformContext, report: StepReport) -> PrecisionRecord:
    """Step 4, fp16: the fused graph measured and converted by the precision engine."""
    context.progress("fuse: measuring activation ranges of the fused graph")
    context.changed()  # the fused graph is measured, not the source file
    with precision_engine.measured(model, context) as measurement:
        context.progress("fuse: converting to fp16")
        record = precision_engine.convert_fused(model, measurement, judge=context.judge)
    report.notes.extend(precision_report.fused_conversion_notes(record))
    return record


def _tidy(model: ir.Model, stated: set[ir.Value]) -> None:
    """The file as written: no duplicate or unused weights, opsets or nodes, no inferred types, no rule names."""
    DeduplicateInitializersPass()(model)
    RemoveUnusedNodesPass()(model)
    RemoveUnusedOpsetsPass()(model)  # onnxscript's private fusion domain
    forget_inferred_types(model, stated)  # inferred shapes are not written: they would grow the file
    _forget_rule_names(model)


def _forget_rule_names(model: ir.Model) -> None:
    """onnxscript tags each node it writes with the rule's name; the report says that, the file need not."""
    for node in all_nodes(model):
        for key in [k for k in node.metadata_props if k.startswith("pkg.onnxscript.")]:
            del node.metadata_props[key]
