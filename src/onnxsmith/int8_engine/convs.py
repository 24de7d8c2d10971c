"""Which Convs int8 may take: their activation ranges measured, and the ones that stay fp32 with why."""

from __future__ import annotations

import numpy as np

from onnxsmith.core.transform import TransformContext
from onnxsmith.int8_engine.measure import measure_ranges
from onnxsmith.int8_engine.parts import MIN_CONV_DEPTH, MIN_CONV_SHARE, ConvDecision
from onnxsmith.passes.quantize_convs import MIN_OPSET, Conv, ConvPlan, int8_rank_problem, uint8_params
from onnxsmith.settings.int8 import Int8Options


def ranges_are_real(context: TransformContext) -> bool:
    """Whether the calibration inputs' ranges are real data's: real inputs, or plausible made-up ones whose
    every image is in a value range known from the model or the user."""
    return context.real_inputs or (context.plausible_inputs and not context.guessed_ranges)


def why_convs_fp32(options: Int8Options, context: TransformContext) -> str:
    if options.convs is False:
        return "stay fp32 by --no-convs"
    if context.plausible_inputs and context.guessed_ranges:
        names = ", ".join(f"'{name}'" for name in context.guessed_ranges)
        example = context.guessed_ranges[0]
        return (
            f"take activation scales from the calibration inputs' ranges, and the value range of {names} is a guess "
            f"(the model does not say it): give it with --input-role {example}=0..255 (or 0..1, normalized), or "
            "real inputs (--inputs)"
        )
    return (
        "go int8 with real calibration inputs (--inputs): the activation scales come from their ranges, and "
        "random inputs' ranges are not real data's (--convs forces it)"
    )


def measure_convs(path, context, convs: list[Conv], opset: int, linear_flops: int = 0) -> dict[str, ConvDecision]:
    """Per Conv: its decision, with the measured ranges and a :class:`ConvPlan` where it is a candidate.
    ``linear_flops``: the Linears' multiply-adds (x2) on the calibration input, for each Conv's share."""
    decisions = {c.name: ConvDecision(c.name, c.shape, c.group, c.relu is not None) for c in convs}
    if not convs:
        return decisions
    context.progress(f"int8: measuring the activation ranges of {len(convs)} Convs")
    feeds = context.range_feeds or context.feeds
    ranges = measure_ranges(path, feeds, {v.name for conv in convs for v in (conv.input, conv.output)})
    for conv in convs:
        d = decisions[conv.name]
        x, y = ranges.get(conv.input.name), ranges.get(conv.output.name)
        if x is not None and y is not None:
            d.input_range, d.output_range, d.elements = (x.low, x.high), (y.low, y.high), y.elements
    total = linear_flops + sum(d.flops for d in decisions.values())
    conv_nodes = {conv.node for conv in convs}
    for conv in convs:
        d = decisions[conv.name]
        x, y = ranges.get(conv.input.name), ranges.get(conv.output.name)
        share = d.flops / total if total else 1.0
        read_by_fp32 = conv.output.is_graph_output() or any(user not in conv_nodes for user, _ in conv.output.uses())
        if opset < MIN_OPSET:
            d.reason, d.kind = f"opset {opset} < {MIN_OPSET} (no QuantizeLinear)", "opset"
        elif int8_rank_problem(conv):
            d.reason, d.kind = int8_rank_problem(conv), f"{len(conv.shape) - 2}-D (int8 takes 1-D and 2-D Convs)"
        elif conv.group > 1:
            d.reason, d.kind = "grouped (depthwise) conv: its int8 kernel measured no faster", "grouped conv"
        elif d.depth < MIN_CONV_DEPTH:
            d.reason, d.kind = f"too shallow ({d.depth} multiply-adds per output < {MIN_CONV_DEPTH})", "too shallow"
        elif read_by_fp32 and share < MIN_CONV_SHARE:
            d.reason, d.kind = (
                f"{share:.2%} of the multiply-adds (< {MIN_CONV_SHARE:.0%}), its output read by fp32 ops: QLinearConv "
                "would round that output to one uint8 scale for little speed",
                "small, read by fp32",
            )
        elif x is None or y is None or not all(np.isfinite([x.low, x.high, y.low, y.high])):
            d.reason, d.kind = "activation range not measured or not finite", "not measured"
        else:
            d.plan = ConvPlan(*uint8_params(x.low, x.high), *uint8_params(y.low, y.high))
    return decisions
