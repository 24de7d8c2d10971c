"""What int8 did, in the words the report and the console show: the first notes, why not more, the tables, and
the refusals of a variant that would gain nothing."""

from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.input_roles import describe_inputs
from onnxsmith.analysis.int8_policy import SpeedCheck
from onnxsmith.core.errors import NothingGained
from onnxsmith.core.transform import StepReport, TransformContext
from onnxsmith.int8_engine.convs import why_convs_fp32
from onnxsmith.int8_engine.parts import COMPENSATION_ROWS, OUTLIERS, WIDE, Part, Parts, of_kind, vectors_per_sample
from onnxsmith.int8_engine.search import JUDGED_SHARE
from onnxsmith.settings.int8 import Int8Options

#: int8 GEMM speed-up over fp32 measured for transformer shapes on AVX-512 VNNI/AMX (docs/int8.md).
KERNEL_SPEEDUP = 4.0
#: A variant with less of the Linears' and Convs' multiply-adds int8 than this, and no smaller than MAX_GAIN_SIZE of
#: the source's weight bytes, is not written: it is the source again (at most a few % faster or smaller).
MIN_GAIN_SHARE = 0.10
MAX_GAIN_SIZE = 0.90
#: int8 Convs calibrated on fewer samples get a note: their static input/output ranges are the calibration's,
#: and inputs beyond them are clipped (PP-OCRv4 rec on 8 text lines: unseen lines' Conv inputs reached 0.55
#: where the calibration's stopped at 0.38; argmax agreement 98.8 %, 99.2 % calibrated on 32).
MIN_CONV_SAMPLES = 32


def _kept_counts(parts: list[Part]) -> dict[str, int]:
    """The fp32 ones counted by the kind of reason."""
    kept: dict[str, int] = {}
    for p in parts:
        if not p.int8:
            why = p.decision.kind or p.decision.reason
            kept[why] = kept.get(why, 0) + 1
    return dict(sorted(kept.items()))


def _kept_lines(parts: list[Part], noun: str, budget: float) -> list[str]:
    """'3 Linear(s) stay fp32: end-to-end error (2.1e-02 to 1.2e-01 alone, budget 0.03)': the fp32 ones by the kind
    of reason, with what their end-to-end measurements found alone where that decided."""
    lines = []
    for kind, n in _kept_counts(parts).items():
        errors = sorted(
            p.decision.piece_error
            for p in parts
            if not p.int8 and p.decision.kind == kind and p.decision.piece_error is not None
        )
        alone = ""
        if errors:
            low, high = (f"{e:.1e}" if math.isfinite(e) else "non-finite outputs" for e in (errors[0], errors[-1]))
            alone = f" ({low}{f' to {high}' if high != low else ''} alone, budget {budget:g})"
        lines.append(f"{n} {noun}(s) stay fp32: {kind}{alone}")
    return lines


def _kept(parts: list[Part]) -> str:
    """The fp32 ones counted by the kind of reason: '2 (one vector per sample), 1 (too small)'."""
    return ", ".join(f"{n} ({k})" for k, n in _kept_counts(parts).items())


def describe_parts(report: StepReport, parts: Parts, budget, form) -> None:
    linears, tables, convs = of_kind(parts, "linear"), of_kind(parts, "table"), of_kind(parts, "conv")
    chosen_tables = [t for t in tables if t.int8]
    int8 = [p for p in linears if p.int8]
    flops = sum(p.flops for p in linears) or 1
    share = sum(p.flops for p in int8) / flops
    smoothed = [p for p in int8 if p.decision.form not in (None, OUTLIERS, WIDE)]
    apart = [p for p in int8 if p.decision.form == OUTLIERS]
    wide = [p for p in int8 if p.decision.form == WIDE]
    compensated = [p for p in int8 if p.decision.compensated]
    few_rows = [p for p in int8 if p.facts.few_rows]
    kernel = KERNEL_SPEEDUP / (2 if form.two_pass else 1)  # two-pass activations: two int8 GEMMs per Linear
    expected = 1.0 / ((1.0 - share) + share / kernel)
    kept = _kept(linears)
    table_note = ""
    if tables:
        stored = sum(t.facts.nbytes for t in chosen_tables)
        table_note = (
            f"; {len(chosen_tables)} of {len(tables)} embedding tables int8 per row ({stored / 1e6:.1f} MB fp32)"
        )
    report.notes.insert(
        0,
        f"{len(int8)} of {len(linears)} Linears int8 (int8 weights per output column, within pairs along K, "
        f"activations per tensor at run time{', in two passes' if form.two_pass else ''}), {share:.0%} of the "
        "Linears' multiply-adds"
        + (f"; {len(wide)} with {WIDE} (uint8: exact, a slower kernel; within pairs over the budget)" if wide else "")
        + (f"; {len(compensated)} with error-compensated rounding" if compensated else "")
        + (
            f"; {len(few_rows)} rounded to nearest: calibrated on fewer rows than {COMPENSATION_ROWS:g} of their "
            "input width (more inputs, --samples, let their rounding be compensated)"
            if few_rows
            else ""
        )
        + (f"; {len(smoothed)} with smoothed inputs" if smoothed else "")
        + (f"; {len(apart)} with their inputs' outlier channels in fp32 beside them" if apart else "")
        + (f"; fp32: {kept}" if kept else "")
        + table_note
        + _convs_note(convs),
    )
    report.notes.append(
        f"expected speed-up if the Linears dominate the run time: {expected:.2f}x "
        f"({share:.0%} of their work at the ~{kernel:g}x of the int8 kernel"
        + (", two GEMMs each" if form.two_pass else "")
        + ")"
    )
    report.why_not_more += _kept_lines(linears, "Linear", budget) + _kept_lines(convs, "Conv", budget)
    report.tables["Linears"] = [p.row() for p in linears]
    if tables:
        report.tables["Embedding tables"] = [t.row() for t in tables]
    if convs:
        report.tables["Convs"] = [p.row() for p in convs]
    report.stats["before_after"] = {
        "Linears in int8": (0, len(int8)),
        "Linears in fp32": (len(linears), len(linears) - len(int8)),
        "tables in int8": (0, len(chosen_tables)),
        "Convs in int8": (0, sum(p.int8 for p in convs)),
    }
    report.stats["int8_flops_share"] = share
    report.stats["compensated_linears"] = [p.name for p in compensated]
    report.stats["expected_speedup"] = expected
    report.stats["error_budget"] = budget


def _convs_note(convs: list[Part]) -> str:
    if not convs:
        return ""
    int8 = [p for p in convs if p.int8]
    flops = sum(p.flops for p in convs) or 1
    kept = _kept(convs)
    return (
        f"; {len(int8)} of {len(convs)} Convs int8 (QLinearConv, activation scales from the calibration inputs), "
        f"{sum(p.flops for p in int8) / flops:.0%} of their multiply-adds" + (f"; fp32: {kept}" if kept else "")
    )


def describe_speed(report: StepReport, check: SpeedCheck, feeds: dict[str, np.ndarray]) -> None:
    where = f"on the first calibration input (batch {vectors_per_sample(feeds)}), onnxruntime CPU, {os.cpu_count() or 1} threads"
    kept = "; ".join(f"{label} ({len(names)}): {without:.2f}x without them" for label, names, without in check.kept)
    report.notes.append(
        f"measured speed-up {where}: {check.speedup:.2f}x the model given"
        + (
            f" (kept fp32 for speed, not faster: {kept}; {check.with_all:.2f}x with everything chosen int8)"
            if kept
            else ""
        )
    )
    if not check.int8:
        report.why_not_more.insert(
            0,
            f"no int8 part measured faster than fp32 here: all kept fp32, {check.speedup:.2f}x the model given ({where})",
        )
    elif check.speedup < 1.0:
        report.why_not_more.insert(
            0,
            f"int8 measured no faster than the model given here: {check.speedup:.2f}x ({where})"
            + ("" if check.trimmed else "; --keep-fast keeps fp32 the int8 parts that do not pay"),
        )
    report.stats["measured_speedup"] = check.speedup
    report.stats["kept_fp32_for_speed"] = sorted(check.kept_names)


#: Ops of a model that is quantized already.
_QUANTIZED_OPS = frozenset(
    {"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "DynamicQuantizeLinear", "MatMulNBits"}
)


_WEIGHT_READERS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def why_none_taken(model: ir.Model) -> list[str]:
    """Why the Convs, MatMuls and Gemms int8 found nothing in are not its to take: the model is quantized
    already, their weights are another float type than fp32, or they sit in subgraphs int8 does not enter."""
    quantized = Counter(n.op_type for g in model.graphs() for n in g if n.op_type in _QUANTIZED_OPS)
    other_float = Counter()
    nested = Counter()
    for graph in model.graphs():
        for node in graph:
            if node.op_type not in _WEIGHT_READERS or len(node.inputs) < 2 or node.inputs[1] is None:
                continue
            if graph is not model.graph:
                nested[node.op_type] += 1
                continue
            weight = node.inputs[1].const_value
            if weight is not None and weight.dtype != ir.DataType.FLOAT and weight.dtype.is_floating_point():
                other_float[(node.op_type, weight.dtype.name.lower())] += 1
    reasons = []
    if quantized:
        reasons.append(f"it is quantized already ({', '.join(f'{n} {op}' for op, n in sorted(quantized.items()))})")
    for (op, dtype), n in sorted(other_float.items()):
        reasons.append(f"its {n} {op}(s) read {dtype} weights, not fp32: int8 starts from an fp32 model")
    if nested:
        ops = ", ".join(f"{n} {op}" for op, n in sorted(nested.items()))
        reasons.append(f"its {ops} are inside If/Loop/Scan subgraphs, which int8 does not enter")
    return reasons


def refuse_too_little(report, parts: Parts, before: int, after: int, context) -> None:
    """NothingGained when so little went int8 that the variant is the source again: under ``MIN_GAIN_SHARE`` of
    the Linears' and Convs' multiply-adds and no smaller than ``MAX_GAIN_SIZE`` of the source's weight bytes
    (isbnx's YOLO: 2 of 102 Convs, 3 % of their work, 0.94x the bytes, as fast as its source). Decided on what
    went int8, not on a timing: the same model gets the same answer on every machine."""
    linears, convs = of_kind(parts, "linear"), of_kind(parts, "conv")
    flops = sum(p.flops for p in [*linears, *convs])
    share = sum(p.flops for p in [*linears, *convs] if p.int8) / flops if flops else 0.0
    size = after / before if before else 1.0
    if share >= MIN_GAIN_SHARE or size <= MAX_GAIN_SIZE:
        return
    went = sum(p.int8 for p in linears), sum(p.int8 for p in convs)
    why = "; ".join(report.why_not_more) or "no other part of it measured worth int8"
    raise NothingGained(
        f"too little went int8 to gain anything, no variant written: {went[0]} Linear(s) and {went[1]} Conv(s), "
        f"{share:.0%} of the multiply-adds (at least {MIN_GAIN_SHARE:.0%} needed) and {size:.2f}x the weight bytes; "
        f"{why}",
        context.source_path,
    )


def two_pass_note(options: Int8Options, two_pass: bool) -> list[str]:
    """Why activations go in two passes where the user did not ask: the gate refused the one-pass variant."""
    if not two_pass or options.two_pass_activations:
        return []
    return [
        f"activations in two passes, and every choice measured with the gate, within {JUDGED_SHARE:.0%} of its "
        "bounds (it judges other inputs): it refused the variant made with one pass and without it"
    ]


def closing_notes(
    report: StepReport,
    model: ir.Model,
    options: Int8Options,
    context: TransformContext,
    *,
    chosen_convs: int,
    found_convs: int,
    with_convs: bool,
    unfused,
    hard_swishes: int,
) -> None:
    """The notes after the parts' tables: what was taken apart for the CPU kernels, where the int8 Convs' scales
    came from, and why the Convs stayed fp32 when int8 did not take them."""
    if unfused.modified:
        report.notes.append(unfused.note())
    if hard_swishes:
        report.notes.append(
            f"for onnxruntime's CPU kernels: {hard_swishes} written-out hard swishes -> x * HardSigmoid(x) (two "
            "passes over the activation instead of four; rules/hardswish.py)"
        )
    samples = sum(vectors_per_sample(feeds) for feeds in context.range_feeds or context.feeds)
    if chosen_convs and context.real_inputs and samples < MIN_CONV_SAMPLES:
        report.notes.append(
            f"the {chosen_convs} int8 Convs' activation ranges come from {samples} calibration sample(s): "
            f"inputs beyond them are clipped; give at least {MIN_CONV_SAMPLES} real ones (--inputs, a recipe's "
            "task data)"
        )
    if chosen_convs and not context.real_inputs:
        report.notes.append(
            f"the {chosen_convs} int8 Convs have activation scales from the ranges of {samples} made-up "
            f"input sets ({'; '.join(describe_inputs(model))}), and the variant was judged on other made-up ones; "
            "real data (--inputs) gives the real ranges"
        )
    if found_convs and not with_convs:
        report.notes[0] += f"; {found_convs} Convs fp32: they {why_convs_fp32(options, context)}"
        report.why_not_more.append(f"{found_convs} Conv(s) stay fp32: they {why_convs_fp32(options, context)}")


def refuse_nothing(model: ir.Model, options: Int8Options, context: TransformContext, found_convs: int) -> NothingGained:
    """The refusal of a model with no part int8 could take, and why its Convs and MatMuls are not int8's."""
    hint = f"; its {found_convs} Convs {why_convs_fp32(options, context)}" if found_convs else ""
    hint += "".join(f"; {why}" for why in why_none_taken(model))
    return NothingGained(
        "has no MatMul or Gemm by a constant fp32 weight and no embedding table: nothing to make int8" + hint,
        context.source_path,
    )


def refuse_unchanged(report: StepReport, context: TransformContext) -> NothingGained:
    """The refusal of a variant in which nothing went int8: a copy of the source is no variant."""
    why = "; ".join(report.why_not_more) or "no part of it measured worth int8"
    return NothingGained(f"nothing went int8, no variant written: {why}", context.source_path)
