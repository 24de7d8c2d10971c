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
   (built on the fp16 transform's passes).

The result is verified against the source before it is written (produce_variant).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import (
    DeduplicateInitializersPass,
    LiftConstantsToInitializersPass,
    RemoveUnusedNodesPass,
    RemoveUnusedOpsetsPass,
)
from onnxscript.rewriter import RewritePass, RewriteRuleSet
from onnxscript.rewriter.rules.common import _basic_rules, _no_op

from onnxsmith.analysis.graph import all_nodes, const_array, infer_types
from onnxsmith.analysis.precision_policy import Limits, policy_reason, unsafe_activations
from onnxsmith.analysis.ranges import TensorRange, measure_ranges
from onnxsmith.errors import UsageError
from onnxsmith.io.save import save_model
from onnxsmith.passes.cast_hygiene import CastHygienePass
from onnxsmith.passes.float_precision import FloatPrecisionPass
from onnxsmith.passes.fold_shapes import FoldShapesPass
from onnxsmith.passes.name_dims import NameDimsPass, name_input_dims
from onnxsmith.passes.prune_rows import PruneRowsPass
from onnxsmith.passes.residual_rescale import choose_scale, find_residual_streams, rescale_residual
from onnxsmith.pipeline import options as opts
from onnxsmith.pipeline.transform import StepReport, Transform, TransformContext, register
from onnxsmith.rules import attention, bias_gelu, layer_scale, noop_reshape, rotary, skip_layernorm, v_bias
from onnxsmith.rules.apply import RuleOutcome, apply_rules
from onnxsmith.verify.inputs import input_specs

#: The fusions in the order they run: (name in the report, rule sets applied in turn).
FUSIONS: list[tuple[str, tuple[RewriteRuleSet, ...]]] = [
    ("erf GELU -> Gelu", (bias_gelu.gelu_rules,)),
    ("layer scale into projections", (layer_scale.layer_scale_rules,)),
    ("RoPE -> RotaryEmbedding", (rotary.prefix_rotary_rules, rotary.all_tokens_rotary_rules)),
    ("softmax attention -> SDPA", (attention.sdpa_rules,)),
    ("SDPA -> MultiHeadAttention", (attention.mha_rules, attention.leftover_sdpa_rules)),
    ("query scale into MultiHeadAttention", (attention.mha_scale_rules,)),
    ("value bias into output bias", (v_bias.v_bias_rules,)),
    ("q/k/v bias into MultiHeadAttention", (attention.mha_bias_rules,)),
    ("Add + LayerNorm -> SkipLayerNormalization", (skip_layernorm.skip_layernorm_rules,)),
    ("Add + Gelu -> BiasGelu", (bias_gelu.bias_gelu_rules,)),
]
#: Generic clean-ups before matching: no-op Casts (TorchScript's float->float), Flatten as Reshape, ...
_CLEANUP = RewriteRuleSet([*_no_op.rules, *_basic_rules.basic_optimization_rules().rules])
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
class Fuse(Transform):
    name = "fuse"
    summary = "fuse a transformer into ONNX Runtime's MultiHeadAttention, RotaryEmbedding, SkipLayerNorm, BiasGelu"

    @dataclass
    class Options:
        precision: str = field(
            default="fp32",
            metadata={
                "choices": ["fp32", "fp16"],
                "help": "fp16: MatMul, attention, RoPE and BiasGelu in fp16, residual stream and LayerNorms fp32; "
                "fp32: the same graph in fp32 (for CPU)",
            },
        )
        static_dims: list[str] = field(
            default_factory=list,
            metadata={
                "help": "symbolic input dims to fix at the size of the inputs given with --shape (e.g. height,width); "
                "every other dim stays dynamic"
            },
        )
        prune_rows: bool = field(
            default=True,
            metadata={"help": "compute only the token rows the outputs read (the CLS row of the last block)"},
        )

    def tolerance(self, options: Options) -> tuple[float, float]:
        # Fusion reorders fp32 arithmetic (SkipLayerNormalization sums in one pass); fp16 rounds activations.
        return (5e-3, 1e-3) if options.precision == "fp32" else (5e-2, 1e-2)

    def apply(self, model: ir.Model, options: Options, context: TransformContext) -> StepReport:
        report = StepReport(self.name, opts.to_json(options))
        before = _op_counts(model)
        dims = input_dims(model, context.feeds[0], options.static_dims)
        if options.precision == "fp16":
            # Before anything renames a value: the stream is found by its Adds and measured by name.
            context.progress("fuse: measuring activation ranges of the source")
            with context.model_file(model) as path:
                ranges = measure_ranges(path, context.feeds)
            report.notes.extend(_rescale_residual_streams(model, ranges))

        context.progress("fuse: folding shape computations")
        fold, noop = prepare_shapes(model, dims, context.feeds[0], progress=context.progress)
        report.notes.append(_fold_note(fold))
        outcomes = [noop]
        for name, stages in FUSIONS:
            context.progress(f"fuse: {name}")
            outcomes.append(apply_fusion(model, name, stages))
        RemoveUnusedNodesPass()(model)
        _check_no_fusion_ops(model)

        if options.prune_rows:
            infer_types(model)
            prune = PruneRowsPass()
            prune(model)
            if prune.pruned:
                rows = {r for _, r, _ in prune.pruned}
                tokens = max(n for _, _, n in prune.pruned)
                report.notes.append(
                    f"{len(prune.pruned)} nodes compute only token rows "
                    f"{', '.join(f'[{a}:{b})' for a, b in sorted(rows))} of {tokens}: "
                    + ", ".join(f"{op} x{n}" for op, n in Counter(n.op_type for n, _, _ in prune.pruned).items())
                )
        if options.precision == "fp16":
            report.notes.extend(_to_fp16(model, context))
        DeduplicateInitializersPass()(model)
        RemoveUnusedNodesPass()(model)
        RemoveUnusedOpsetsPass()(model)  # onnxscript's private fusion domain

        report.tables["rules"] = [o.row() for o in outcomes]
        matched = [o for o in outcomes if o.matched]
        report.notes.insert(0, "fused: " + (", ".join(f"{o.name} x{o.matched}" for o in matched) or "nothing"))
        after = _op_counts(model)
        report.stats["rules"] = {o.name: o.matched for o in outcomes}
        report.stats["before_after"] = {
            op: (before.get(op, 0), after.get(op, 0)) for op in _REPORTED_OPS if before.get(op, 0) or after.get(op, 0)
        }
        report.stats["op_counts"] = {"before": dict(sorted(before.items())), "after": dict(sorted(after.items()))}
        return report


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


def prepare_shapes(
    model: ir.Model, dims: dict[str, int], feeds: dict[str, np.ndarray] | None = None, *, progress=None
) -> tuple[FoldShapesPass, RuleOutcome]:
    """Step 1: shape arithmetic folded, Constants lifted, no-op Casts and Reshapes gone, dims named."""
    fold = FoldShapesPass(dims, feeds=feeds, progress=progress)
    fold(model)
    LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    RewritePass(_CLEANUP)(model)
    RemoveUnusedNodesPass()(model)
    NameDimsPass(dims)(model)
    noop = apply_rules(model, "no-op Reshape", noop_reshape.noop_reshape_rules)
    _bypass_identities(model.graph)
    return fold, noop


def _bypass_identities(graph: ir.Graph) -> None:
    """Readers of an Identity's result read its input instead (main graph; graph outputs stay)."""
    for node in list(graph):
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and not node.outputs[0].is_graph_output():
            node.outputs[0].replace_all_uses_with(node.inputs[0])
            graph.remove(node, safe=True)


# ------------------------------------------------------------------ 2. fusions (3. rows: passes/prune_rows.py)


def apply_fusion(model: ir.Model, name: str, stages: tuple[RewriteRuleSet, ...]) -> RuleOutcome:
    """One entry of ``FUSIONS``, on shapes inferred afresh (the previous rewrites made new values)."""
    infer_types(model)
    return apply_rules(model, name, *stages)


def _check_no_fusion_ops(model: ir.Model) -> None:
    """onnxscript's intermediate SDPA op must have become MultiHeadAttention: it is no ONNX Runtime op."""
    left = [n for n in all_nodes(model) if n.domain == attention.FUSION_DOMAIN]
    if left:
        raise RuntimeError(f"internal error: {len(left)} {left[0].op_type} node(s) of {attention.FUSION_DOMAIN} left")


# ------------------------------------------------------------------ 4. precision (fp16)
#
# Built on the fp16 transform's passes: its residual rescaling (passes/residual_rescale.py)
# runs on the unfused graph, where the stream is a chain of Adds read by LayerNorms; its
# converter (passes/float_precision.py) then runs on the fused graph with the fuse policy.

#: Normalisations compute in fp32 (they read the fp32 residual stream and reduce over it).
_FP32_OPS = frozenset({"LayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})


def _rescale_residual_streams(model: ir.Model, ranges: list[TensorRange]) -> list[str]:
    """Scale a residual stream that overflows fp16 by a power of two, so the fp16 projections writing it fit."""
    limits = Limits.for_dtype(ir.DataType.FLOAT16)
    measured = {r.name: r.absmax for r in ranges}
    notes = []
    infer_types(model)
    for stream in find_residual_streams(model):
        peak = max((measured.get(v.name, 0.0) for v in stream.values), default=0.0)
        if peak <= limits.max_abs:
            continue
        if stream.problem is not None:
            notes.append(f"residual stream peaks at {peak:.3g} but is not rescaled: {stream.problem}")
            continue
        writers = max((measured.get(v.name, 0.0) for v in stream.scaled), default=0.0)
        scale = choose_scale(max(peak, writers), limits.max_abs)
        rescale_residual(model, stream, scale)
        notes.append(
            f"residual stream ({stream.describe()}, measured peak {peak:.3g}) carried scaled by "
            f"1/{round(1 / scale)} so the fp16 projections that write it fit"
        )
    return notes


def _to_fp16(model: ir.Model, context: TransformContext) -> list[str]:
    """MatMul, attention, RoPE, BiasGelu in fp16; the residual stream and the normalisations in fp32."""
    context.progress("fuse: measuring activation ranges of the fused graph")
    with tempfile.TemporaryDirectory(prefix="onnxsmith-fuse-") as tmp:
        path = Path(tmp) / "fused_fp32.onnx"
        save_model(model, path)
        ranges = measure_ranges(path, context.feeds)
    limits = Limits.for_dtype(ir.DataType.FLOAT16)
    keep = _fused_residual_stream(model)
    unsafe = unsafe_activations(ranges, limits)
    for name, why in unsafe.items():
        keep.setdefault(name, why.reason)
    head = _per_sample_tail(model)

    def policy(node: ir.Node) -> str | None:
        if node.op_type in _FP32_OPS and node.domain in ("", "ai.onnx", "com.microsoft"):
            return "normalisation (fuse keeps LayerNorms fp32)"
        if node in head:
            return "after the token row is selected: one vector per sample, fp32 costs nothing"
        return policy_reason(node)

    context.progress("fuse: converting to fp16")
    precision = FloatPrecisionPass(ir.DataType.FLOAT16, keep_fp32=keep, policy=policy, limits=limits)
    precision(model)
    hygiene = CastHygienePass()
    hygiene(model)
    low = precision.result.low_nodes
    return [
        f"fp16: {sum(low.values())} nodes compute in fp16 ({', '.join(f'{op} {n}' for op, n in low.most_common())}); "
        f"{len(precision.result.kept)} stay fp32 (residual stream, normalisations"
        + (f", {len(unsafe)} tensors measured out of fp16's range" if unsafe else "")
        + ")",
        f"casts: {precision.result.casts_added} inserted; {hygiene.counts.describe()}",
    ]


def _fused_residual_stream(model: ir.Model) -> dict[str, str]:
    """The residual stream of a fused graph: what SkipLayerNormalization adds to (its skip) and its sums."""
    keep: dict[str, str] = {}
    for node in model.graph:
        if node.domain == "com.microsoft" and node.op_type in _FP32_OPS:
            keep[node.inputs[1].name] = "residual stream"
            if len(node.outputs) > 3 and node.outputs[3].uses():
                keep[node.outputs[3].name] = "residual stream"
    return keep


def _per_sample_tail(model: ir.Model) -> set[ir.Node]:
    """Nodes from a Gather that picks one token row on (a CLS head): they see one vector per sample."""
    tail: set[ir.Node] = set()
    for node in model.graph:  # topological: a node's producers come first
        if _picks_a_row(node) or any(v is not None and v.producer() in tail for v in node.inputs):
            tail.add(node)
    return tail


def _picks_a_row(node: ir.Node) -> bool:
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.inputs[0].shape is None:
        return False
    rank = node.inputs[0].shape.rank()
    index = const_array(node.inputs[1])
    return rank >= 3 and index is not None and index.ndim == 0 and node.attributes.get_int("axis", 0) in (rank - 2, -2)


# ------------------------------------------------------------------ the report


def _fold_note(fold: FoldShapesPass) -> str:
    if fold.skipped:
        return f"shape computations left as they were: {fold.skipped}"
    return (
        f"shape computations folded: {fold.folded} values became constants, {fold.reshapes} Reshape "
        f"targets constant, {fold.concats} Concat of repeated constants -> Pad + Add"
    )


def _op_counts(model: ir.Model) -> Counter:
    return Counter(node.op_type for node in all_nodes(model))
