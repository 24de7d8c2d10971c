"""``fuse``: a transformer graph rewritten into ONNX Runtime's fused contrib operators.

What either torch exporter writes for a ViT or BERT encoder becomes, per block,
SkipLayerNormalization -> three projections -> RotaryEmbedding of q and k ->
MultiHeadAttention -> output projection -> SkipLayerNormalization -> MatMul ->
BiasGelu -> MatMul. The steps:

1. Shapes (passes/): the input dims are named; everything computed from
   constants and input shapes is evaluated and folded (fold_shapes), so every
   Reshape has a constant target with -1 for the batch and a fixed-size image
   input needs no Shape/Gather/Concat/Expand at run time; inferred dims get the
   names of the input dims they follow (name_dims) so the rules can compare them.
2. Fusions (rules/, in the order of ``FUSIONS``): each either matches, as often
   as it can, or leaves the graph as it was and says why it did not.
3. Row pruning (passes/prune_rows.py): where the outputs read only some
   tokens (a CLS head), the last block computes only those.
4. Precision: ``fp32`` keeps every type; ``fp16`` runs MatMul, attention, RoPE
   and BiasGelu in fp16 while the residual stream and the LayerNorms stay fp32
   (the precision engine, :mod:`onnxsmith.precision.engine`, on measured ranges).

The result is verified against the source before it is written (produce_variant).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import (
    DeduplicateInitializersPass,
    LiftConstantsToInitializersPass,
    RemoveUnusedNodesPass,
    RemoveUnusedOpsetsPass,
)
from onnxscript.rewriter import RewritePass, RewriteRuleSet

from onnxsmith.core import options as opts
from onnxsmith.core.errors import UsageError
from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.irutil.types import forget_inferred_types, infer_types, typed_values
from onnxsmith.irutil.walk import all_nodes
from onnxsmith.passes.fold_constants_guarded import FoldConstantsGuardedPass
from onnxsmith.passes.fold_shapes import FoldShapesPass, FoldShapesResult, constants_to_evaluate
from onnxsmith.passes.lower_to_opset import LowerToOpsetPass
from onnxsmith.passes.name_dims import NameDimsPass, name_input_dims
from onnxsmith.passes.prune_rows import PruneRowsPass
from onnxsmith.passes.raise_opset import RaiseOpsetPass, default_opset
from onnxsmith.precision import engine
from onnxsmith.precision import report as precision_report
from onnxsmith.rules import (
    attention,
    bias_gelu,
    layer_norm,
    layer_scale,
    noop_reshape,
    rotary,
    skip_layernorm,
    v_bias,
)
from onnxsmith.rules.apply import RuleOutcome, apply_rules, bypass_identities, would_match
from onnxsmith.rules.cleanup import cleanup_rules
from onnxsmith.runtime.evaluate import evaluate_constants
from onnxsmith.runtime.inputs import input_specs
from onnxsmith.settings.fuse import FUSE, FuseOptions

#: The fusions in the order they run: (name in the report, rule sets applied in turn).
FUSIONS: list[tuple[str, tuple[RewriteRuleSet, ...]]] = [
    ("written-out LayerNorm -> LayerNormalization", (layer_norm.layer_norm_rules, layer_norm.layer_norm_no_beta_rules)),
    ("erf GELU -> Gelu", (bias_gelu.gelu_rules,)),
    ("layer scale into projections", (layer_scale.layer_scale_rules,)),
    ("RoPE -> RotaryEmbedding", (rotary.prefix_rotary_rules, rotary.all_tokens_rotary_rules)),
    ("softmax attention -> SDPA", (attention.sdpa_rules,)),
    ("SDPA -> MultiHeadAttention", (attention.mha_rules, attention.leftover_sdpa_rules)),
    # A MultiHeadAttention placed between head transposes: the pairs that cancel go, so its inputs are the
    # projections (whose biases the next entry takes in).
    ("no-op Transpose/Reshape pairs", (cleanup_rules, cleanup_rules, noop_reshape.noop_reshape_rules)),
    ("query scale into MultiHeadAttention", (attention.mha_scale_rules,)),
    ("value bias into output bias", (v_bias.v_bias_rules,)),
    ("q/k/v bias into MultiHeadAttention", (attention.mha_bias_rules,)),
    ("Add + LayerNorm -> SkipLayerNormalization", (skip_layernorm.skip_layernorm_rules,)),
    ("Add + Gelu -> BiasGelu", (bias_gelu.bias_gelu_rules,)),
]
#: Fusions whose op exists from an opset on: a model below it is converted first, where they match.
OPSET_NEEDED = {"written-out LayerNorm -> LayerNormalization": 17}
#: Ops worth a row in the before/after table.
_REPORTED_OPS = (
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SkipLayerNormalization",
    "BiasGelu",
    "LayerNormalization",
    "MatMul",
    "Add",
    "Mul",
    "Softmax",
    "Reshape",
    "Transpose",
    "Shape",
    "Gather",
    "Concat",
    "Expand",
    "Slice",
    "Split",
    "Cast",
)


@register
class Fuse(Transform, settings=FUSE):
    def apply(self, model: ir.Model, options: FuseOptions, context: TransformContext) -> StepReport:
        report = StepReport(self.name, opts.to_json(options))
        before = _op_counts(model)
        weights_before = precision_report.weight_bytes_by_type(model)
        stated = typed_values(model)
        input_dims(model, context.feeds[0], options.static_dims)  # names unnamed dims, fixes the static ones
        if options.precision == "fp16":
            # Before anything renames a value: the stream is found by its Adds and measured by name.
            context.progress("fuse: measuring activation ranges of the source")
            streams = engine.rescale_streams_for_fusion(model, engine.measure(model, context))
            report.notes.extend(precision_report.fused_stream_notes(streams))

        context.progress("fuse: folding shape computations")
        fold, noop = prepare_shapes(model, progress=context.progress)
        report.notes.append(_fold_note(fold))
        outcomes = [noop]
        opset = default_opset(model)
        for name, stages in FUSIONS:
            context.progress(f"fuse: {name}")
            outcomes.append(apply_fusion(model, name, stages))
        if default_opset(model) != opset:
            report.notes.append(
                f"the model was converted from opset {opset} to {default_opset(model)}: "
                + ", ".join(f"{n} needs it" for n, v in OPSET_NEEDED.items() if v == default_opset(model))
            )
        RemoveUnusedNodesPass()(model)
        _check_no_fusion_ops(model)
        LowerToOpsetPass()(model)  # the rules write Shape(start, end), an opset-15 form
        # What the rewrites left constant (MultiHeadAttention's packed bias is a Concat of the q/k/v
        # biases) is folded, under the rule that nothing grows the file.
        FoldConstantsGuardedPass()(model)
        LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)

        if options.prune_rows:
            infer_types(model)
            prune = PruneRowsPass()(model)
            if prune.pruned:
                rows = {r for _, r, _ in prune.pruned}
                tokens = max(n for _, _, n in prune.pruned)
                report.notes.append(
                    f"{len(prune.pruned)} nodes compute only token rows "
                    f"{', '.join(f'[{a}:{b})' for a, b in sorted(rows))} of {tokens}: "
                    + ", ".join(f"{op} x{n}" for op, n in Counter(n.op_type for n, _, _ in prune.pruned).items())
                )
        record = None
        if options.precision == "fp16":
            context.progress("fuse: measuring activation ranges of the fused graph")
            context.changed()  # the fused graph is measured, not the source file
            with engine.measured(model, context) as measurement:
                context.progress("fuse: converting to fp16")
                record = engine.convert_fused(model, measurement, judge=context.judge)
            report.notes.extend(precision_report.fused_conversion_notes(record))
        DeduplicateInitializersPass()(model)
        RemoveUnusedNodesPass()(model)
        RemoveUnusedOpsetsPass()(model)  # onnxscript's private fusion domain
        forget_inferred_types(model, stated)  # inferred shapes are not written: they would grow the file
        _forget_rule_names(model)

        report.tables["rules"] = [o.row() for o in outcomes]
        report.why_not_more = _why_not_more(options, fold)
        if record is not None:
            weights_after = precision_report.weight_bytes_by_type(model)
            report.why_not_more[:0] = precision_report.why_not_more(record, weights_before, weights_after)
            report.why_not_more[:0] = record.repair_lines  # kept fp32 after verification, and why
        matched = [o for o in outcomes if o.matched]
        report.notes.insert(0, "fused: " + (", ".join(f"{o.name} x{o.matched}" for o in matched) or "nothing"))
        after = _op_counts(model)
        report.stats["rules"] = {o.name: o.matched for o in outcomes}
        report.stats["before_after"] = {
            op: (before.get(op, 0), after.get(op, 0)) for op in _REPORTED_OPS if before.get(op, 0) or after.get(op, 0)
        }
        report.stats["op_counts"] = {"before": dict(sorted(before.items())), "after": dict(sorted(after.items()))}
        return report

    def repairs(self, options: FuseOptions) -> bool:
        return options.precision == "fp16"  # the precision engine keeps fp32 what the refusal comes from


# ------------------------------------------------------------------ 1. shapes


def input_dims(model: ir.Model, feeds: dict[str, np.ndarray], static: list[str] = ()) -> dict[str, int]:
    """Each symbolic input dim (unnamed ones get named) with its size in ``feeds``; ``static`` ones become fixed."""
    names = name_input_dims(model)
    unknown = sorted(set(static) - set(names))
    if unknown:
        raise UsageError(
            f"--static-dims: the model has no symbolic input dim {', '.join(unknown)} "
            f"(it has: {', '.join(names) or 'none'})"
        )
    sizes: dict[str, int] = {}
    for value, spec in zip(
        [v for v in model.graph.inputs if v.name not in model.graph.initializers], input_specs(model)
    ):
        shape = np.shape(feeds[spec.name]) if spec.name in feeds else ()
        for axis, dim in enumerate(value.shape or ()):
            if not isinstance(dim, int) and axis < len(shape):
                sizes.setdefault(dim.value, int(shape[axis]))
    for name in static:
        for value in model.graph.inputs:
            if value.shape is not None:
                value.shape = ir.Shape(
                    [sizes[name] if not isinstance(d, int) and d.value == name else d for d in value.shape]
                )
    return {name: size for name, size in sizes.items() if name not in static}


def prepare_shapes(model: ir.Model, *, progress=None) -> tuple[FoldShapesResult, RuleOutcome]:
    """Step 1: shape arithmetic folded, Constants lifted, no-op Casts and Reshapes gone, dims named."""
    request = constants_to_evaluate(model)
    if progress and request.values:
        progress(f"evaluating {len(request.values)} constant shape computations")
    fold = FoldShapesPass(evaluate_constants(model, request))(model)
    LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    RewritePass(cleanup_rules)(model)
    RemoveUnusedNodesPass()(model)
    NameDimsPass()(model)
    noop = apply_rules(model, "no-op Reshape", noop_reshape.noop_reshape_rules)
    bypass_identities(model.graph)
    return fold, noop


# ------------------------------------------------------------------ 2. fusions (3. rows: passes/prune_rows.py)


def apply_fusion(model: ir.Model, name: str, stages: tuple[RewriteRuleSet, ...]) -> RuleOutcome:
    """One entry of ``FUSIONS``, on shapes inferred afresh (the previous rewrites made new values).

    Where its op needs a newer opset than the model's and its rules match, the model is
    converted to that opset first; a model they do not match keeps its own.
    """
    infer_types(model)
    needed, opset = OPSET_NEEDED.get(name), default_opset(model)
    if needed and opset is not None and opset < needed and would_match(model, *stages):
        raised = RaiseOpsetPass(needed)(model)
        if not raised.modified:
            return RuleOutcome(
                name, 0, f"its op needs opset {needed}; converting the model from {opset}: {raised.reason}"
            )
        infer_types(model)
    return apply_rules(model, name, *stages)


def _forget_rule_names(model: ir.Model) -> None:
    """onnxscript tags each node it writes with the rule's name; the report says that, the file need not."""
    for node in all_nodes(model):
        for key in [k for k in node.metadata_props if k.startswith("pkg.onnxscript.")]:
            del node.metadata_props[key]


def _check_no_fusion_ops(model: ir.Model) -> None:
    """onnxscript's intermediate SDPA op must have become MultiHeadAttention: it is no ONNX Runtime op."""
    left = [n for n in all_nodes(model) if n.domain == attention.FUSION_DOMAIN]
    if left:
        raise RuntimeError(f"internal error: {len(left)} {left[0].op_type} node(s) of {attention.FUSION_DOMAIN} left")


# ------------------------------------------------------------------ the report


def _fold_note(fold: FoldShapesResult) -> str:
    if fold.skipped:
        return f"shape computations left computed: {fold.skipped}"
    return (
        f"shape computations folded: {fold.folded} values became constants, {fold.reshapes} Reshape "
        f"targets constant, {fold.concats} Concat of repeated constants -> Pad + Add"
    )


def _why_not_more(options, fold: FoldShapesResult) -> list[str]:
    """What fuse left as it was, and why: the headline's lines after the size (the rules table says
    why each fusion that found nothing did not match)."""
    lines = []
    if options.precision == "fp32":
        lines.append("the weights stay fp32: fusion rewrites the graph, not the weights (precision='fp16' halves them)")
    if fold.skipped:
        lines.append(f"shape computations left as they were: {fold.skipped}")
    return lines


def _op_counts(model: ir.Model) -> Counter:
    return Counter(node.op_type for node in all_nodes(model))
