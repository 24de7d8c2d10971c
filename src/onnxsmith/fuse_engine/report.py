"""What fuse did, in the words the report and the console show: the notes, why not more, the rules table's and
the before/after table's rows, the stats, and the refusals of options the model cannot take."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxsmith.core.errors import UsageError
from onnxsmith.core.transform import StepReport
from onnxsmith.irutil.walk import all_nodes
from onnxsmith.passes.fold_shapes import FoldShapesResult
from onnxsmith.precision import report as precision_report
from onnxsmith.precision.engine import PrecisionRecord
from onnxsmith.rules import decoder_attention
from onnxsmith.rules.apply import RuleOutcome
from onnxsmith.settings.fuse import FuseOptions

#: Ops worth a row in the before/after table.
REPORTED_OPS = (
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


def unknown_static_dims(unknown: list[str], names: list[str]) -> UsageError:
    """The refusal of ``--static-dims`` naming dims the model's inputs do not have."""
    return UsageError(
        f"--static-dims: the model has no symbolic input dim {', '.join(unknown)} "
        f"(it has: {', '.join(names) or 'none'})"
    )


def opset_refused(needed: int, opset: int, reason: str) -> str:
    """Why a fusion whose op needs a newer opset found nothing: the model could not be converted."""
    return f"its op needs opset {needed}; converting the model from {opset}: {reason}"


def fold_note(fold: FoldShapesResult) -> str:
    if fold.skipped:
        return f"shape computations left computed: {fold.skipped}"
    return (
        f"shape computations folded: {fold.folded} values became constants, {fold.reshapes} Reshape and "
        f"{fold.expands} Expand targets constant, {fold.concats} Concat of repeated constants -> Pad + Add"
    )


def opset_note(before: int | None, after: int | None, needed: dict[str, int]) -> str:
    """The model was raised from opset ``before`` to ``after`` for the fusions whose ``needed`` opset that is."""
    return f"the model was converted from opset {before} to {after}: " + ", ".join(
        f"{name} needs it" for name, opset in needed.items() if opset == after
    )


def prune_note(pruned: list[tuple[ir.Node, tuple[int, int], int]]) -> str:
    """The nodes that compute only some token rows: (node, the rows [a, b) it computes, the rows it had)."""
    rows = {r for _, r, _ in pruned}
    tokens = max(n for _, _, n in pruned)
    return (
        f"{len(pruned)} nodes compute only token rows "
        f"{', '.join(f'[{a}:{b})' for a, b in sorted(rows))} of {tokens}: "
        + ", ".join(f"{op} x{n}" for op, n in Counter(n.op_type for n, _, _ in pruned).items())
    )


def why_not_more(options: FuseOptions, fold: FoldShapesResult) -> list[str]:
    """What fuse left as it was, and why: the headline's lines after the size (the rules table says
    why each fusion that found nothing did not match)."""
    lines = []
    if options.precision == "fp32":
        lines.append("the weights stay fp32: fusion rewrites the graph, not the weights (precision='fp16' halves them)")
    if fold.skipped:
        lines.append(f"shape computations left as they were: {fold.skipped}")
    return lines


def op_counts(model: ir.Model) -> Counter:
    return Counter(node.op_type for node in all_nodes(model))


def describe(
    report: StepReport,
    model: ir.Model,
    options: FuseOptions,
    fold: FoldShapesResult,
    outcomes: list[RuleOutcome],
    record: PrecisionRecord | None,
    counts_before: Counter,
    weights_before: dict[str, int],
) -> None:
    """The rules table, why not more, the first note (what was fused) and the stats of the fused ``model``."""
    report.tables["rules"] = [o.row() for o in outcomes]
    report.why_not_more = why_not_more(options, fold)
    if record is not None:
        weights_after = precision_report.weight_bytes_by_type(model)
        report.why_not_more[:0] = precision_report.why_not_more(record, weights_before, weights_after)
        report.why_not_more[:0] = record.repair_lines  # kept fp32 after verification, and why
    before, after = counts_before, op_counts(model)
    if after.get("GroupQueryAttention", 0) > before.get("GroupQueryAttention", 0):
        report.why_not_more.append(decoder_attention.LIMITS)
    matched = [o for o in outcomes if o.matched]
    report.notes.insert(0, "fused: " + (", ".join(f"{o.name} x{o.matched}" for o in matched) or "nothing"))
    report.stats["rules"] = {o.name: o.matched for o in outcomes}
    report.stats["before_after"] = {
        op: (before.get(op, 0), after.get(op, 0)) for op in REPORTED_OPS if before.get(op, 0) or after.get(op, 0)
    }
    report.stats["op_counts"] = {"before": dict(sorted(before.items())), "after": dict(sorted(after.items()))}
