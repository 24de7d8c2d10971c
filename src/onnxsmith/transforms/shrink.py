"""``shrink``: make a graph smaller without changing what it computes.

Four passes, in this order:

1. fp64 constants read only through a Cast to float are stored as fp32
   (passes/narrow_fp64.py; first, so the folding below does not hide it);
2. constant folding that never grows the file (passes/fold_constants_guarded.py, the
   rule of analysis/fold_cost.py): a constant subexpression is folded when what it
   stores, less the constants that die with it, is at most ``max_fold_growth`` bytes
   (default 4 KB: shape arithmetic). Quantised weights stay quantised (an int8 -> float
   dequantisation would store 4x), shared weights stay shared (a Transpose of a weight
   other nodes read would store a copy), an Expand/Tile/ConstantOfShape stays computed;
3. int64 index regions whose values provably fit int32 are born int32
   (passes/narrow_int64.py);
4. identical constants are stored once (passes/dedup_constants.py).

The gate (produce_variant) demands integer outputs bit-identical and float outputs
within the one gate's fp32 bounds (verify/gate.py). ``--explain`` shows every change and why, and before/after
breakdowns from the same analysis ``inspect`` uses.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxsmith.analysis.fold_cost import WIDENED_REFUSAL
from onnxsmith.analysis.summary import ModelSummary, summarize
from onnxsmith.core import options as opts
from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.io.files import human_bytes
from onnxsmith.irutil.types import forget_inferred_types, infer_types, typed_values
from onnxsmith.passes.dedup_constants import DeduplicateConstantsPass
from onnxsmith.passes.fold_constants_guarded import FoldConstantsGuardedPass, GuardedFoldResult
from onnxsmith.passes.narrow_fp64 import NarrowFp64ConstantsPass
from onnxsmith.passes.narrow_int64 import NarrowInt64Pass, NarrowInt64Result, values_to_evaluate
from onnxsmith.runtime.evaluate import evaluate_min_max
from onnxsmith.settings.shrink import SHRINK, ShrinkOptions, parse_bytes


@register
class Shrink(Transform, settings=SHRINK):
    def apply(self, model: ir.Model, options: ShrinkOptions, context: TransformContext) -> StepReport:
        stated = typed_values(model)
        infer_types(model)  # shapes size the fold guard and the int64 regions
        before = summarize(model)
        report = StepReport(self.name, opts.to_json(options))
        changes: list[dict] = []
        if options.narrow_fp64:
            fp64 = NarrowFp64ConstantsPass()(model)
            if fp64.narrowed:
                saved = sum(c.nbytes_before // 2 for c in fp64.narrowed)
                report.notes.append(
                    f"stored {len(fp64.narrowed)} fp64 constant(s) read as fp32 as fp32 ({human_bytes(saved)} saved)"
                )
            changes += _fp64_changes(fp64)
        if options.fold:
            context.progress("shrink: folding constants (guarded)")
            fold = FoldConstantsGuardedPass(max_growth=parse_bytes(options.max_fold_growth))(model)
            report.notes.append(_fold_note(fold))
            changes += _fold_changes(fold)
        if options.narrow_int64:
            context.progress("shrink: narrowing int64 indices")
            infer_types(model)  # folding created values; the regions need their shapes
            evaluated = evaluate_min_max(model, values_to_evaluate(model))
            narrow = NarrowInt64Pass(evaluated=evaluated)(model)
            report.notes.extend(_narrow_notes(narrow))
            changes += _int64_changes(narrow)
        if options.dedup:
            dedup = DeduplicateConstantsPass()(model)
            if dedup.removed:
                saved = sum(d.nbytes for d in dedup.removed)
                report.notes.append(f"merged {len(dedup.removed)} duplicate constant(s) ({human_bytes(saved)})")
            changes += [
                {
                    "change": "duplicate merged",
                    "where": d.name,
                    "bytes": human_bytes(d.nbytes),
                    "why": f"identical to {d.kept}",
                }
                for d in dedup.removed
            ]
        RemoveUnusedNodesPass()(model)
        after = summarize(model)
        report.why_not_more = _why_not_more(
            after, fold if options.fold else None, narrow if options.narrow_int64 else None
        )
        forget_inferred_types(model, stated)  # inferred shapes are not written: they would grow the file
        report.stats["before_after"] = _before_after(before, after)
        report.details = {
            "changes": changes,
            "stored bytes by dtype": _by_dtype(before, after),
            "nodes by op (changed)": _ops(before, after),
            "largest stored tensors before": _largest(before),
            "largest stored tensors after": _largest(after),
            "inspect warnings": [
                {"when": when, "warning": w} for when, s in (("before", before), ("after", after)) for w in s.warnings
            ],
        }
        return report


def _fp64_changes(fp64) -> list[dict]:
    return [
        {
            "change": "fp64 -> fp32",
            "where": c.name,
            "bytes": human_bytes(c.nbytes_before // 2),
            "why": f"every reader converts it to float32 ({c.casts_removed} Cast(s) removed)",
        }
        for c in fp64.narrowed
    ]


def _fold_changes(fold: GuardedFoldResult) -> list[dict]:
    return [
        {
            "change": "kept computed",
            "where": f"{r.node} ({r.op_type})",
            "bytes": "?" if r.output_bytes is None else human_bytes(r.output_bytes),
            "why": r.reason,
        }
        for r in fold.refused
    ]


def _int64_changes(narrow: NarrowInt64Result) -> list[dict]:
    changes = []
    for r in narrow.reports:
        where = f"{', '.join(r.values[:4])}{' ...' if len(r.values) > 4 else ''} (read by {', '.join(r.read_by)})"
        changes.append(
            {
                "change": "int64 -> int32" if r.narrowed else "int64 kept",
                "where": where,
                "bytes": human_bytes(r.saved_bytes + r.saved_runtime_bytes),
                "why": (f"values in {r.bounds[0]}..{r.bounds[1]}: {r.proof}" if r.narrowed else r.proof)
                + (f"; Cast at {', '.join(r.casts_at_producers)}" if r.casts_at_producers else "")
                + (f"; {r.casts_back} Cast(s) back to int64 for other readers" if r.casts_back else ""),
            }
        )
    return changes


def _fold_note(fold: GuardedFoldResult) -> str:
    note = f"folded {fold.folded} constant node(s)"
    big = [r for r in fold.refused if r.output_bytes is not None]
    if big:
        largest = max(big, key=lambda r: r.output_bytes)
        note += (
            f"; kept {len(big)} computed at run time that would have stored "
            f"{human_bytes(sum(r.output_bytes for r in big))} (largest: {largest.node}, {largest.op_type}, "
            f"{human_bytes(largest.output_bytes)})"
        )
    return note


#: Weights shrink stores as they are (fp16 or quantize change how they are stored).
_FLOAT_DTYPES = ("FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE")


def _why_not_more(after: ModelSummary, fold: GuardedFoldResult | None, narrow: NarrowInt64Result | None) -> list[str]:
    """What shrink left as it was, and why: the headline's lines after the size."""
    lines = []
    stored = sum(after.bytes_by_dtype.values())
    floats = sum(after.bytes_by_dtype.get(d, 0) for d in _FLOAT_DTYPES)
    if stored and floats / stored >= 0.5:
        lines.append(
            f"{human_bytes(floats)} of the {human_bytes(stored)} stored are float weights, which shrink keeps "
            "as they are (fp16 or quantize store them smaller)"
        )
    # Not the weights fp16 stores narrow and widens where read in fp32: folded they would only grow the file.
    refused = fold.refused if fold is not None else []
    big = [r for r in refused if r.output_bytes is not None and not r.reason.startswith(WIDENED_REFUSAL)]
    if big:
        lines.append(
            f"{len(big)} constant(s) stay computed at run time: folded they would store "
            f"{human_bytes(sum(r.output_bytes for r in big))} (max_fold_growth bounds what a fold may add)"
        )
    kept = [r for r in narrow.reports if not r.narrowed] if narrow is not None else []
    if kept:
        lines.append(f"{len(kept)} int64 index region(s) stay int64: their values are not proven to fit int32")
    return lines


def _narrow_notes(narrow: NarrowInt64Result) -> list[str]:
    done = [r for r in narrow.reports if r.narrowed]
    notes = []
    if done:
        notes.append(
            f"{len(done)} int64 index region(s) born int32: {human_bytes(sum(r.saved_bytes for r in done))} less stored, "
            f"{human_bytes(sum(r.saved_runtime_bytes for r in done))} less computed at run time"
        )
    kept = [r for r in narrow.reports if not r.narrowed]
    if kept:
        notes.append(f"{len(kept)} int64 region(s) kept (see --explain)")
    return notes


def _before_after(before: ModelSummary, after: ModelSummary) -> dict[str, tuple[str, str]]:
    rows = {
        "stored bytes": (
            human_bytes(sum(before.bytes_by_dtype.values())),
            human_bytes(sum(after.bytes_by_dtype.values())),
        )
    }
    for dtype in sorted(set(before.bytes_by_dtype) | set(after.bytes_by_dtype)):
        rows[f"  {dtype}"] = (
            human_bytes(before.bytes_by_dtype.get(dtype, 0)),
            human_bytes(after.bytes_by_dtype.get(dtype, 0)),
        )
    return rows


def _by_dtype(before: ModelSummary, after: ModelSummary) -> list[dict]:
    return [
        {
            "dtype": d,
            "before": human_bytes(before.bytes_by_dtype.get(d, 0)),
            "after": human_bytes(after.bytes_by_dtype.get(d, 0)),
        }
        for d in sorted(set(before.bytes_by_dtype) | set(after.bytes_by_dtype))
    ]


def _ops(before: ModelSummary, after: ModelSummary) -> list[dict]:
    ops = sorted(set(before.ops) | set(after.ops))
    return [
        {"op": op, "before": before.ops.get(op, 0), "after": after.ops.get(op, 0)}
        for op in ops
        if before.ops.get(op, 0) != after.ops.get(op, 0)
    ]


def _largest(summary: ModelSummary) -> list[dict]:
    return [
        {
            "name": t.name,
            "dtype": t.dtype,
            "shape": "x".join(map(str, t.shape)),
            "bytes": human_bytes(t.bytes),
            "read by": ", ".join(t.readers[:3]),
        }
        for t in summary.largest[:5]
    ]
