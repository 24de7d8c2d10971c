"""``fp16``: weights and compute in fp16, with fp32 islands where measurement says fp16 overflows.

A thin user of the precision engine (:mod:`onnxsmith.precision`), which every
low-precision conversion shares:

1. Measure the source on the calibration inputs: every float tensor's max |x|
   (:func:`onnxsmith.precision.engine.measure`; the same run gives the gate its
   reference outputs).
2. Decide (:mod:`onnxsmith.precision.plan`): residual streams that overflow fp16 stay
   one fp32 path end to end with the branch that writes their massive activation
   (``residual_fp32``, default), or, with ``--no-residual-fp32``, are carried scaled by
   a power of two so they and their writers fit fp16; tensors over 65,504 / headroom or
   badly underflowing stay fp32 with the nodes that write or read them; accumulating
   reductions and recurrent cells stay fp32 by policy; tiny readouts stay fp32 by cost.
3. Apply (:mod:`onnxsmith.precision.apply`): rescale, convert the rest
   (:class:`~onnxsmith.passes.float_precision.FloatPrecisionPass`), clean the Casts.
4. Show (:mod:`onnxsmith.precision.report`): notes, the fp32 islands table, the numbers.

The gate (``produce_variant``) then runs the variant storage-faithfully — every fp16
tensor really rounded to fp16, as a GPU holds it — and refuses to write it if an output
is NaN/inf (naming the first tensor that overflowed) or outside the one gate's fp16
bounds (:mod:`onnxsmith.verify.gate`). When it refuses, the conversion is made once more
with the tensors the refusal is measured to come from kept fp32
(:mod:`onnxsmith.precision.repair`; the report says which and why), and judged again.
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from onnxsmith.analysis.type_rules import opset_of, signature
from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.core.options import to_json
from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.types import FLOAT_TYPES, forget_inferred_types, infer_types, typed_values
from onnxsmith.irutil.walk import all_nodes, constant_tensors
from onnxsmith.passes.cast_hygiene import count_casts
from onnxsmith.precision import engine
from onnxsmith.precision import report as precision_report
from onnxsmith.precision.engine import PrecisionRecord
from onnxsmith.precision.plan import Settings
from onnxsmith.settings.fp16 import FP16, Fp16Options

#: The options by their short name.
Options = Fp16Options


@register
class Fp16(Transform, settings=FP16):
    def apply(self, model: ir.Model, options: Options, context: TransformContext) -> StepReport:
        source = context.source_path
        dtype = ir.DataType.FLOAT16
        stated = typed_values(model)
        infer_types(model)
        _check_convertible(model, source, dtype)
        casts_before = count_casts(model)
        weight_bytes_before = precision_report.weight_bytes_by_type(model)
        context.progress(f"fp16: measuring activation ranges on {len(context.feeds)} input set(s)")
        settings = Settings(
            dtype=dtype,
            headroom=options.headroom,
            rescale=options.rescale_residual,
            residual_fp32=options.residual_fp32,
            small_fp32=options.small_fp32,
            keep_io_types=options.keep_io_types,
        )
        with engine.measured(model, context) as measurement:
            context.progress("fp16: converting")
            record = engine.convert(
                model, measurement.ranges, settings, infer=False, measurement=measurement, judge=context.judge
            )
        streams = record.plan.streams
        if options.rescale_residual and not any(d.scale != 1.0 for d in streams):
            found = [d.note for d in streams if d.note]
            why = found[0] if found else "no pre-LN residual stream (Adds read by LayerNormalization) was found"
            if not found and streams:
                why = "the residual stream already fits"
            raise UsageError(f"--rescale-residual: {why}", source)
        # Inferred shapes are not written: on a small model they are a few percent of the file (ppocr's
        # MobileNetV3 classifier: 27 KB of 572 KB). Types the conversion changed are its values' own.
        forget_inferred_types(model, stated)
        return _report(self.name, options, model, record, casts_before, weight_bytes_before)

    def repairs(self, options: Options) -> bool:
        return True  # the engine keeps fp32 what the gate's refusal is measured to come from


def _check_convertible(model: ir.Model, path, dtype: ir.DataType) -> None:
    """Exit 2 with a clear message when there is nothing to convert or an op cannot be handled."""
    for node in all_nodes(model):
        if node.domain not in ("", "ai.onnx", "ai.onnx.ml") and signature(node, opset_of(model, node)) is None:
            raise InputError(
                f"node '{node_label(node)}' is the custom op {node.domain}::{node.op_type}, whose type rules "
                "are unknown and which onnxruntime cannot run to calibrate or verify a conversion",
                path,
            )
    kinds: Counter = Counter()
    for graph in model.graphs():
        for value in [*graph.inputs, *graph.outputs, *graph.initializers.values()]:
            kinds[value.dtype] += 1
        for node in graph:
            for value in node.outputs:
                kinds[value.dtype] += 1
    for const in constant_tensors(model):
        kinds[const.tensor.dtype] += 1
    if kinds[ir.DataType.FLOAT]:
        return
    if kinds[dtype]:
        raise InputError(f"is already {dtype.name.lower()} (no fp32 tensors to convert)", path)
    if not any(kinds[t] for t in FLOAT_TYPES):
        raise InputError("has no floating-point tensors; there is nothing to convert to fp16", path)
    raise InputError("has no fp32 tensors to convert", path)


def _report(name, options, model, record: PrecisionRecord, casts_before, weights_before) -> StepReport:
    report = StepReport(step=name, options=to_json(options))
    weights_after = precision_report.weight_bytes_by_type(model)
    # Why the file is not about half its source's: the report's first lines.
    report.why_not_more = precision_report.why_not_more(record, weights_before, weights_after)
    report.why_not_more += record.repair_lines  # kept fp32 after verification, and why
    report.notes.extend(precision_report.conversion_notes(record))
    precision = record.precision
    low = precision_report.low_name(precision.dtype)
    report.stats = {
        "before_after": {
            "Casts": (casts_before, count_casts(model)),
            f"float nodes in {low}": (0, sum(precision.low_nodes.values())),
            f"MatMul/Gemm/Conv in {low}": (0, sum(precision.low_nodes[o] for o in ("MatMul", "Gemm", "Conv"))),
            "fp32 weights": (_mb(weights_before.get("float", 0)), _mb(weights_after.get("float", 0))),
            f"{low} weights": (
                _mb(weights_before.get(precision.dtype.name.lower(), 0)),
                _mb(weights_after.get(precision.dtype.name.lower(), 0)),
            ),
        },
        **precision_report.conversion_stats(record),
    }
    report.tables["fp32 islands"] = precision_report.islands_table(record)
    return report


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"
