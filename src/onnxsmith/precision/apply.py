"""Carrying out a precision :class:`~onnxsmith.precision.plan.Plan`: the passes, in order.

1. :func:`rescale_streams`: the residual streams the plan carries scaled
   (:func:`onnxsmith.passes.residual_rescale.rescale_residual`);
2. :func:`apply_plan`: the conversion with the plan's islands
   (:class:`~onnxsmith.passes.float_precision.FloatPrecisionPass`), then the Casts cleaned
   (:class:`~onnxsmith.passes.cast_hygiene.CastHygienePass`).

Nothing here decides or measures: every choice is in the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from onnxsmith.passes.cast_hygiene import CastCounts, CastHygienePass
from onnxsmith.passes.float_precision import FloatPrecisionPass, PrecisionResult
from onnxsmith.passes.residual_rescale import rescale_residual
from onnxsmith.precision.plan import Plan, StreamDecision


@dataclass
class Applied:
    """What applying a plan did."""

    precision: PrecisionResult
    casts: CastCounts


def rescale_streams(model: ir.Model, streams: list[StreamDecision]) -> None:
    """Carry each stream the decisions scale by its factor (constants and epsilons change; types do not)."""
    for decision in streams:
        if decision.scale != 1.0:
            rescale_residual(model, decision.stream, decision.scale)


def apply_plan(model: ir.Model, plan: Plan, *, infer: bool = True) -> Applied:
    """Convert ``model`` to the plan's low type with its islands, then clean the Casts.

    ``infer``: False when the types inferred before the plan was made still hold (rescaling
    changes constants and attributes only).
    """
    settings = plan.settings
    precision = FloatPrecisionPass(
        settings.dtype,
        keep_fp32=plan.keep_fp32,
        policy=plan.node_reasons.get,
        keep_io_types=settings.keep_io_types,
        limits=settings.limits,
        infer=infer,
        store_low=plan.store_low,
    )(model)
    casts = CastHygienePass()(model).counts
    return Applied(precision, casts)
