"""fp16 with fp32 islands, decided from measured ranges: what ``fp16`` does to a model after measuring it.

Given the source's measured ranges (:mod:`onnxsmith.runtime.ranges`),
:func:`convert_precision` rescales or keeps fp32 the residual streams that overflow,
keeps fp32 what the precision policy says must stay (:mod:`onnxsmith.analysis.precision_policy`),
converts the rest (:class:`~onnxsmith.passes.float_precision.FloatPrecisionPass`) and cleans
the Casts (:class:`~onnxsmith.passes.cast_hygiene.CastHygienePass`). It runs nothing: the
measurements come in as data. How its decisions are shown is :mod:`onnxsmith.precision.islands`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from onnxsmith.analysis.measurements import TensorRange
from onnxsmith.analysis.precision_policy import (
    DEFAULT_HEADROOM,
    Limits,
    SmallNodes,
    Unsafe,
    policy_reason,
    unsafe_activations,
)
from onnxsmith.irutil.types import FLOAT_TYPES, infer_types
from onnxsmith.passes.cast_hygiene import CastCounts, CastHygienePass
from onnxsmith.passes.float_precision import FloatPrecisionPass, PrecisionResult
from onnxsmith.passes.residual_rescale import ResidualStream, choose_scale, find_residual_streams, rescale_residual


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
    report.precision = FloatPrecisionPass(
        dtype, keep_fp32=keep, policy=policy, keep_io_types=keep_io_types, limits=limits, infer=False
    )(model)
    report.casts = CastHygienePass()(model).counts
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
