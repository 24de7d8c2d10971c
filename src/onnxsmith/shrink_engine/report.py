"""What shrink did, in the words the report and the console show: the notes, why not more, the before/after
numbers, and the ``--explain`` tables (each change and why, stored bytes by dtype, nodes by op, the largest
stored tensors, inspect's warnings)."""

from __future__ import annotations

from dataclasses import dataclass

from onnxsmith.analysis.fold_cost import WIDENED_REFUSAL
from onnxsmith.analysis.summary import ModelSummary
from onnxsmith.core.transform import StepReport
from onnxsmith.io.files import human_bytes
from onnxsmith.passes.dedup_constants import DedupResult
from onnxsmith.passes.fold_constants_guarded import GuardedFoldResult
from onnxsmith.passes.narrow_fp64 import NarrowFp64Result
from onnxsmith.passes.narrow_int64 import NarrowInt64Result

#: Weights shrink stores as they are (fp16 or quantize change how they are stored).
_FLOAT_DTYPES = ("FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE")


@dataclass
class ShrinkRecord:
    """What each of shrink's passes did, in their order; None: the pass was turned off."""

    fp64: NarrowFp64Result | None = None
    fold: GuardedFoldResult | None = None
    narrow: NarrowInt64Result | None = None
    dedup: DedupResult | None = None


def describe(report: StepReport, record: ShrinkRecord, before: ModelSummary, after: ModelSummary) -> StepReport:
    """``report`` with what the passes did and left (``record``) and the model ``before`` and ``after`` them."""
    report.notes.extend(_notes(record))
    report.why_not_more = _why_not_more(after, record.fold, record.narrow)
    report.stats["before_after"] = _before_after(before, after)
    report.details = {
        "changes": _changes(record),
        "stored bytes by dtype": _by_dtype(before, after),
        "nodes by op (changed)": _ops(before, after),
        "largest stored tensors before": _largest(before),
        "largest stored tensors after": _largest(after),
        "inspect warnings": [
            {"when": when, "warning": w} for when, s in (("before", before), ("after", after)) for w in s.warnings
        ],
    }
    return report


def _notes(record: ShrinkRecord) -> list[str]:
    """A line per pass that did something (folding: always), in the passes' order."""
    notes = []
    fp64, dedup = record.fp64, record.dedup
    if fp64 is not None and fp64.narrowed:
        saved = sum(c.nbytes_before // 2 for c in fp64.narrowed)
        notes.append(f"stored {len(fp64.narrowed)} fp64 constant(s) read as fp32 as fp32 ({human_bytes(saved)} saved)")
    if record.fold is not None:
        notes.append(_fold_note(record.fold))
    if record.narrow is not None:
        notes.extend(_narrow_notes(record.narrow))
    if dedup is not None and dedup.removed:
        saved = sum(d.nbytes for d in dedup.removed)
        notes.append(f"merged {len(dedup.removed)} duplicate constant(s) ({human_bytes(saved)})")
    return notes


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


def _changes(record: ShrinkRecord) -> list[dict]:
    """``--explain``'s rows, a change (or a refusal to change) each, in the passes' order."""
    changes = []
    if record.fp64 is not None:
        changes += _fp64_changes(record.fp64)
    if record.fold is not None:
        changes += _fold_changes(record.fold)
    if record.narrow is not None:
        changes += _int64_changes(record.narrow)
    if record.dedup is not None:
        changes += _dedup_changes(record.dedup)
    return changes


def _fp64_changes(fp64: NarrowFp64Result) -> list[dict]:
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


def _dedup_changes(dedup: DedupResult) -> list[dict]:
    return [
        {
            "change": "duplicate merged",
            "where": d.name,
            "bytes": human_bytes(d.nbytes),
            "why": f"identical to {d.kept}",
        }
        for d in dedup.removed
    ]


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
