"""``fp16``: weights and compute in fp16, with fp32 islands where measurement says fp16 overflows.

1. Measure the source on the calibration inputs: every float tensor's max |x|
   (:func:`onnxsmith.analysis.ranges.measure_ranges`; the same run gives the gate its
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

For other transforms (``fuse --precision fp16``): :func:`convert_precision` is steps
2-4 on an in-memory model given measured ranges; the passes can be used one by one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.graph import FLOAT_TYPES, all_nodes, constant_tensors, infer_types, node_label
from onnxsmith.analysis.precision_policy import (
    DEFAULT_HEADROOM,
    Limits,
    SmallNodes,
    Unsafe,
    policy_reason,
    unsafe_activations,
)
from onnxsmith.analysis.ranges import TensorRange, measure_ranges
from onnxsmith.analysis.type_rules import opset_of, signature
from onnxsmith.errors import InputError, UsageError
from onnxsmith.passes.cast_hygiene import CastCounts, CastHygienePass, count_casts
from onnxsmith.passes.float_precision import FloatPrecisionPass, PrecisionResult
from onnxsmith.passes.residual_rescale import ResidualStream, choose_scale, find_residual_streams, rescale_residual
from onnxsmith.pipeline.options import to_json
from onnxsmith.pipeline.transform import StepReport, Transform, TransformContext, register
from onnxsmith.verify.compare import FAITHFUL, NATIVE, Comparison, compare_models
from onnxsmith.verify.fp16_storage import has_fp16

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


@dataclass
class StreamDecision:
    stream: ResidualStream
    peak: float  # measured max |x| over the stream (source scale)
    peak_tensor: str = ""
    scale: float = 1.0
    kept_fp32: bool = False
    note: str = ""
    #: (writer, its measured max |x|, nodes kept fp32 to compute it) for over-range writers
    writers: list[tuple[str, float, int]] = field(default_factory=list)


#: How a node computing a massive activation is kept (the islands table groups on it).
WRITER_REASON = "computes what writes into the residual stream"


@dataclass
class PrecisionReport:
    """What :func:`convert_precision` did, for a StepReport."""

    streams: list[StreamDecision] = field(default_factory=list)
    unsafe: dict[str, Unsafe] = field(default_factory=dict)
    precision: PrecisionResult | None = None
    casts: CastCounts | None = None
    keep_fp32: dict[str, str] = field(default_factory=dict)
    small: dict[str, str] = field(default_factory=dict)  # tensors small enough to stay fp32

    def islands(self) -> list[dict]:
        """The fp32 islands as table rows (see :func:`_islands`)."""
        return _islands(self, self.small)


def convert_precision(
    model: ir.Model,
    ranges: list[TensorRange],
    *,
    dtype: ir.DataType = ir.DataType.FLOAT16,
    headroom: float = DEFAULT_HEADROOM,
    rescale: bool | None = None,
    residual_fp32: bool = True,
    small_fp32: bool = True,
    keep_io_types: bool = True,
    keep_fp32: dict[str, str] | None = None,
    infer: bool = True,
) -> PrecisionReport:
    """Rescale overflowing residual streams, then convert ``model`` in place to ``dtype`` with fp32 islands.

    ``ranges`` are the source's measured ranges (names as in ``model``); ``keep_fp32``
    adds tensors the caller wants kept fp32 (name -> reason).

    A residual stream that overflows is handled one of two ways:

    * ``residual_fp32`` (default): the stream stays one fp32 path end to end, and so does
      each branch that writes an over-range value into it (DINOv3's massive activation comes
      from one block's MLP): such a value is only as exact as the arithmetic that made it,
      and fp16's relative error at 1.5e5 is an absolute error larger than the other channels,
      which LayerNorm's mean then spreads over every channel. Nothing needs rescaling.
    * ``residual_fp32=False``: the stream is carried scaled by a power of two so that it and
      its writers fit fp16, and everything runs in fp16 (LayerNorm inputs included).

    ``rescale``: True rescales every rescalable stream whatever ``residual_fp32`` says (then
    the writers, fitting, run fp16), False none, None (default) when the second way needs it.
    ``infer``: False when the caller has just run :func:`infer_types` on ``model``.
    """
    limits = Limits.for_dtype(dtype, headroom)
    measured = {r.name: r.absmax for r in ranges}
    report = PrecisionReport()
    scale_of: dict[str, float] = {}
    keep = dict(keep_fp32 or {})
    if infer:
        infer_types(model)
    for stream in find_residual_streams(model):
        peak_value = max(stream.values, key=lambda v: measured.get(v.name, 0.0))
        peak = measured.get(peak_value.name, 0.0)
        decision = StreamDecision(stream, peak, peak_value.name)
        report.streams.append(decision)
        overflows = peak > limits.max_abs
        wanted = rescale if rescale is not None else (overflows and not residual_fp32)
        if wanted and stream.problem is not None:
            decision.note = f"not rescaled: {stream.problem}"
        elif wanted:
            writers_peak = max((measured.get(v.name, 0.0) for v in stream.scaled), default=0.0)
            decision.scale = choose_scale(max(peak, writers_peak), limits.max_abs)
            if decision.scale != 1.0:
                rescale_residual(model, stream, decision.scale)
                scale_of.update({v.name: decision.scale for v in stream.scaled})
        if overflows and residual_fp32:
            decision.kept_fp32 = True
            reason = f"residual stream, max |x| {peak:.3g} in the source"
            keep.update({v.name: reason for v in stream.values if v.name not in keep})
            if decision.scale == 1.0:
                _keep_massive_writers(stream, measured, limits, keep, decision)
    report.unsafe = unsafe_activations(ranges, limits, scale=scale_of)
    for name, unsafe in report.unsafe.items():
        keep.setdefault(name, unsafe.reason)
    report.keep_fp32 = keep
    small = SmallNodes(model, ranges) if small_fp32 else None
    report.small = small.tensors if small else {}

    def policy(node: ir.Node) -> str | None:
        reason = policy_reason(node)
        if reason is None and small is not None:
            reason = small.reason(node)
        return reason

    # Rescaling changed constants and attributes only: the types inferred above still hold.
    precision = FloatPrecisionPass(
        dtype, keep_fp32=keep, policy=policy, keep_io_types=keep_io_types, limits=limits, infer=False
    )
    precision(model)
    report.precision = precision.result
    hygiene = CastHygienePass()
    hygiene(model)
    report.casts = hygiene.counts
    return report


def _keep_massive_writers(
    stream: ResidualStream, measured: dict[str, float], limits: Limits, keep: dict[str, str], decision: StreamDecision
) -> None:
    """Keep fp32 every branch that writes an over-range value into the (fp32) stream."""
    for writer in stream.writers():
        peak = measured.get(writer.name, 0.0)
        if peak <= limits.max_abs:
            continue
        reason = f"{WRITER_REASON} '{writer.name}' (max |x| {peak:.3g})"
        nodes = stream.writer_nodes(writer)
        decision.writers.append((writer.name, peak, len(nodes)))
        for node in nodes:
            for out in node.outputs:
                if out.dtype in FLOAT_TYPES and out.name:
                    keep.setdefault(out.name, reason)


@register
class Fp16(Transform):
    name = "fp16"
    summary = "weights and compute to fp16, with fp32 islands where measured ranges overflow (never NaN)"
    Options = Options

    def tolerance(self, options: Options) -> tuple[float, float]:
        return (2e-2, 2e-2) if options.dtype == "fp16" else (8e-2, 8e-2)

    def verify(self, options: Options, reference, candidate, feeds, *, atol: float, rtol: float) -> Comparison:
        """The usual comparison, without running the source again when calibration already did."""
        cached = getattr(self, "_reference", None)
        if cached is not None and cached[0] is feeds:
            return compare_models(
                reference, candidate, feeds, atol=atol, rtol=rtol, reference_outputs=cached[1], reference_mode=cached[2]
            )
        return compare_models(reference, candidate, feeds, atol=atol, rtol=rtol)

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
        self._reference = (
            (context.feeds, outputs, FAITHFUL if has_fp16(model) else NATIVE) if context.model_is_source else None
        )
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


def _islands(result: PrecisionReport, small: dict[str, str]) -> list[dict]:
    """The fp32 islands: connected groups of fp32 nodes kept for the same kind of reason."""
    precision = result.precision
    stream_peak = {v.name: d for d in result.streams for v in d.stream.values}

    def kind(node: ir.Node) -> str:
        tensor = precision.kept_for.get(node)
        if tensor is None:
            reason = precision.kept[node_label(node)]
            return "small tensors" if reason.startswith("small") else reason.split(" ")[0] + " policy"
        if tensor in stream_peak:
            return "residual stream"
        if result.keep_fp32.get(tensor, "").startswith(WRITER_REASON):
            return "stream writer"
        if tensor in result.unsafe:
            return "over range" if "max |x|" in result.unsafe[tensor].reason else "underflow"
        return "constant out of range" if tensor not in result.keep_fp32 else "kept by caller"

    kept = precision.kept_nodes
    kinds = {node: kind(node) for node in kept}
    parent = {node: node for node in kept}

    def find(node):
        while parent[node] is not node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for node in kept:
        for value in node.outputs:
            for user, _ in value.uses():
                if user in parent and kinds[user] == kinds[node]:
                    parent[find(user)] = find(node)
    groups: dict[ir.Node, list[ir.Node]] = {}
    for node in kept:
        groups.setdefault(find(node), []).append(node)
    rows = []
    for nodes in groups.values():
        what = kinds[nodes[0]]
        tensors = [precision.kept_for[n] for n in nodes if precision.kept_for.get(n)]
        measured, tensor, peak = "-", "-", -1.0
        if what == "residual stream":
            decision = stream_peak[tensors[0]]
            peak = decision.peak
            measured = f"{peak:.3g}" + (
                f" (carried x1/{round(1 / decision.scale)}: {peak * decision.scale:.3g})"
                if decision.scale != 1.0
                else ""
            )
            tensor = decision.peak_tensor
        elif what == "stream writer":
            writer = next(w for d in result.streams for w in d.writers if w[0] in result.keep_fp32[tensors[0]])
            peak, tensor = writer[1], writer[0]
            measured = f"{peak:.3g}"
        elif what in ("over range", "underflow"):
            worst = max(tensors, key=lambda t: result.unsafe[t].absmax)
            peak, tensor = result.unsafe[worst].absmax, worst
            measured = f"{peak:.3g}" if what == "over range" else result.unsafe[worst].reason
        elif what == "small tensors":
            outs = [o.name for n in nodes for o in n.outputs if o.name in small]
            tensor = outs[0] if outs else "-"
            measured = small.get(tensor, "-")
        else:
            measured = precision.kept[node_label(nodes[0])]
        ops = Counter(n.op_type for n in nodes)
        rows.append(
            {
                "island": node_label(nodes[0]),
                "kept for": what,
                "nodes": len(nodes),
                "ops": ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
                "measured": measured,
                "tensor": tensor,
                "_peak": peak,
            }
        )
    rows.sort(key=lambda r: (-r["_peak"], r["kept for"], r["island"]))
    for row in rows:
        del row["_peak"]
    return rows


def _report(name, options, model, result: PrecisionReport, ranges, casts_before, weights_before) -> StepReport:
    precision = result.precision
    islands = result.islands()
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
