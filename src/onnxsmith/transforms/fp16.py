"""``fp16``: weights and compute in fp16, with fp32 islands where measurement says fp16 overflows.

1. Measure the source on the calibration inputs: every float tensor's max |x|
   (:func:`onnxsmith.runtime.ranges.measure_ranges`; the same run gives the gate its
   reference outputs).
2. Residual streams (:mod:`onnxsmith.passes.residual_rescale`): a pre-LN transformer's
   stream that overflows fp16 stays one fp32 path end to end, and so does the branch
   that writes its massive activation (``residual_fp32``, default); or, with
   ``--no-residual-fp32``, it is carried scaled by a power of two so it and its writers
   fit fp16 (``rescale_residual``: automatic then).
3. Islands (:mod:`onnxsmith.analysis.precision_policy`): tensors over 65,504 / headroom
   or badly underflowing stay fp32 with the nodes that write or read them; accumulating
   reductions and recurrent cells stay fp32 by policy; tiny readouts stay fp32 by cost.
4. Convert the rest (:class:`~onnxsmith.passes.float_precision.FloatPrecisionPass`),
   then clean the Casts (:class:`~onnxsmith.passes.cast_hygiene.CastHygienePass`).

The gate (``produce_variant``) then runs the variant storage-faithfully — every fp16
tensor really rounded to fp16, as a GPU holds it — and refuses to write it if an output
is NaN/inf or outside tolerance, naming the first tensor that overflowed.

Steps 2-4 are :func:`onnxsmith.precision.convert.convert_precision`, on an in-memory model
given measured ranges; the passes can be used one by one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.precision_policy import DEFAULT_HEADROOM, Limits
from onnxsmith.analysis.type_rules import opset_of, signature
from onnxsmith.core.errors import InputError, UsageError
from onnxsmith.core.options import to_json
from onnxsmith.core.transform import ReferenceOutputs, StepReport, Transform, TransformContext, register
from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.types import FLOAT_TYPES, infer_types
from onnxsmith.irutil.walk import all_nodes, constant_tensors
from onnxsmith.passes.cast_hygiene import count_casts
from onnxsmith.precision.convert import PrecisionReport, convert_precision
from onnxsmith.precision.islands import islands_table
from onnxsmith.runtime.fp16_storage import has_fp16
from onnxsmith.runtime.ranges import measure_ranges
from onnxsmith.runtime.runner import FAITHFUL, NATIVE

DTYPES = {"fp16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}


@dataclass
class Options:
    keep_io_types: bool = field(default=True, metadata={"help": "keep the model's float inputs and outputs fp32"})
    headroom: float = field(
        default=DEFAULT_HEADROOM,
        metadata={"help": "keep fp32 every tensor whose measured max |x| is over 65,504 / headroom"},
    )
    rescale_residual: bool | None = field(
        default=None,
        metadata={
            "help": "carry an overflowing pre-LN residual stream scaled by a power of two so it and "
            "what writes it fit fp16 (automatic: when the stream is carried in fp16)"
        },
    )
    residual_fp32: bool = field(
        default=True,
        metadata={
            "help": "keep an overflowing residual stream, and the branch that writes its massive "
            "activation, fp32 end to end (more accurate than carrying it rescaled in fp16)"
        },
    )
    small_fp32: bool = field(
        default=True,
        metadata={
            "help": "keep fp32 the nodes whose tensors are tiny next to the largest activation "
            "(a readout on the pooled token): fp16 saves nothing there"
        },
    )
    dtype: str = field(default="fp16", metadata={"choices": list(DTYPES), "help": "the low-precision type"})

    def validate(self) -> None:
        if not self.headroom >= 1.0:
            raise ValueError(f"headroom must be at least 1, not {self.headroom}")


@register
class Fp16(Transform):
    name = "fp16"
    summary = "weights and compute to fp16, with fp32 islands where measured ranges overflow (never NaN)"
    Options = Options

    def tolerance(self, options: Options) -> tuple[float, float]:
        return (2e-2, 2e-2) if options.dtype == "fp16" else (8e-2, 8e-2)

    def apply(self, model: ir.Model, options: Options, context: TransformContext) -> StepReport:
        source = context.source_path
        dtype = DTYPES[options.dtype]
        if dtype == ir.DataType.BFLOAT16:
            # The conversion itself handles bf16 (convert_precision); the gate cannot: onnxruntime's CPU
            # provider has no bf16 kernels and the storage-faithful emulation covers fp16 only.
            raise UsageError(
                "--dtype bf16: a bf16 variant cannot be verified on this machine (onnxruntime's CPU "
                "provider has no bf16 kernels); convert with --dtype fp16",
                source,
            )
        infer_types(model)
        _check_convertible(model, source, dtype)
        casts_before = count_casts(model)
        weight_bytes_before = _float_weight_bytes(model)
        context.progress(f"fp16: measuring activation ranges on {len(context.feeds)} input set(s)")
        outputs: dict[str, np.ndarray] = {}
        with context.model_file(model) as measured:
            ranges = measure_ranges(measured, context.feeds, outputs=outputs, derive_movement=True)
        # Calibrating the source computed its outputs: the gate compares with them (after an
        # earlier step of a chain they are that step's outputs, not the source's: not reused).
        if context.model_is_source:
            context.reference = ReferenceOutputs(outputs, FAITHFUL if has_fp16(model) else NATIVE)
        context.progress("fp16: converting")
        result = convert_precision(
            model,
            ranges,
            dtype=dtype,
            headroom=options.headroom,
            rescale=options.rescale_residual,
            residual_fp32=options.residual_fp32,
            small_fp32=options.small_fp32,
            keep_io_types=options.keep_io_types,
            infer=False,
        )
        if options.rescale_residual and not any(d.scale != 1.0 for d in result.streams):
            found = [d.note for d in result.streams if d.note]
            why = found[0] if found else "no pre-LN residual stream (Adds read by LayerNormalization) was found"
            if not found and result.streams:
                why = "the residual stream already fits"
            raise UsageError(f"--rescale-residual: {why}", source)
        return _report(self.name, options, model, result, ranges, casts_before, weight_bytes_before)


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


def _float_weight_bytes(model: ir.Model) -> dict[str, int]:
    sizes: Counter = Counter()
    for const in constant_tensors(model):
        if const.tensor.dtype in FLOAT_TYPES:
            sizes[const.tensor.dtype.name.lower()] += const.tensor.nbytes
    return dict(sizes)


def _report(name, options, model, result: PrecisionReport, ranges, casts_before, weights_before) -> StepReport:
    precision = result.precision
    islands = islands_table(result)
    report = StepReport(step=name, options=to_json(options))
    low = sum(precision.low_nodes.values())
    convertible = sum(precision.float_nodes.values())
    low_name = precision.dtype.name.lower().replace("float16", "fp16").replace("bfloat16", "bf16")
    report.notes.append(
        f"measured {len(ranges)} float tensors; {len(result.unsafe)} over the safe range "
        f"(max |x| > {Limits.for_dtype(precision.dtype, options.headroom).max_abs:,.0f}) or underflowing"
    )
    for decision in result.streams:
        line = f"residual stream: {decision.stream.describe()}, measured peak {decision.peak:.3g}"
        if decision.scale != 1.0:
            line += (
                f"; carried scaled by 1/{round(1 / decision.scale)} (writers' weights scaled, "
                f"{len(decision.stream.norms)} LayerNorm epsilons x {decision.scale**2:g})"
            )
        if decision.note:
            line += f"; {decision.note}"
        if decision.kept_fp32:
            line += "; kept fp32 end to end"
        for writer, peak, count in decision.writers:
            line += f"; '{writer}' ({peak:.3g}) written by {count} nodes kept fp32"
        report.notes.append(line)
    report.notes.append(
        f"{low} of {convertible} float nodes compute in {low_name} "
        f"({', '.join(f'{op} {n}' for op, n in precision.low_nodes.most_common(6))}); "
        f"{len(precision.kept)} kept fp32 in {len(islands)} island(s); "
        f"{precision.shape_nodes} shape computations left as they are"
    )
    report.notes.append(
        f"{precision.weights_converted} weights stored in {low_name} "
        f"({precision.weight_bytes_saved / 2**20:.1f} MB saved)"
        + (f"; {len(precision.weights_kept)} kept fp32 (also read in fp32)" if precision.weights_kept else "")
    )
    report.notes.append(f"casts: {precision.casts_added} inserted at island borders; {result.casts.describe()}")
    if precision.unknown_ops:
        report.notes.append(f"left fp32 (type rules unknown): {', '.join(sorted(set(precision.unknown_ops)))}")
    casts_after = count_casts(model)
    weights_after = _float_weight_bytes(model)
    report.stats = {
        "before_after": {
            "Casts": (casts_before, casts_after),
            f"float nodes in {low_name}": (0, low),
            f"MatMul/Gemm/Conv in {low_name}": (0, sum(precision.low_nodes[o] for o in ("MatMul", "Gemm", "Conv"))),
            "fp32 weights": (_mb(weights_before.get("float", 0)), _mb(weights_after.get("float", 0))),
            f"{low_name} weights": (
                _mb(weights_before.get(precision.dtype.name.lower(), 0)),
                _mb(weights_after.get(precision.dtype.name.lower(), 0)),
            ),
        },
        "measured_tensors": len(ranges),
        "unsafe_tensors": len(result.unsafe),
        "low_nodes": dict(precision.low_nodes),
        "kept_fp32": dict(precision.kept),
        "casts_inserted": precision.casts_added,
        "cast_hygiene": vars(result.casts),
        "weights_converted": precision.weights_converted,
        "residual_streams": [
            {"values": len(d.stream.values), "peak": d.peak, "scale": d.scale, "note": d.note} for d in result.streams
        ],
    }
    report.tables["fp32 islands"] = islands
    return report


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"
