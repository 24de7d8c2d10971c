"""Which Convs int8 may take: their activation ranges measured, and the ones that stay fp32 with why."""

from __future__ import annotations

import numpy as np

from onnxsmith.core.transform import TransformContext
from onnxsmith.int8_engine.parts import MIN_CONV_DEPTH, MIN_CONV_SHARE, ConvFacts, Part
from onnxsmith.int8_engine.statistics import announced, measure_ranges
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
    if context.unlike_real and not context.real_inputs:
        return (
            "go int8 with real calibration inputs (--inputs): the activation scales come from their ranges, and "
            f"made-up values of {', '.join(context.unlike_real)} are not real data's (--convs forces it)"
        )
    return (
        "go int8 with real calibration inputs (--inputs): the activation scales come from their ranges, and "
        "random inputs' ranges are not real data's (--convs forces it)"
    )


def measure_convs(
    path, context, convs: list[Conv], opset: int, role: dict[str, str], linear_flops: int = 0
) -> dict[str, Part]:
    """Per Conv: its part, with the measured ranges and a :class:`ConvPlan` where it is a candidate, else the
    reason it stays fp32. ``linear_flops``: the Linears' multiply-adds (x2) on the calibration input, for each
    Conv's share; ``role``: each Conv's (analysis/int8_policy.roles)."""
    parts = {c.name: Part("conv", c.name, ConvFacts(c.shape, c.group, c.relu is not None), role[c.name]) for c in convs}
    if not convs:
        return parts
    shards = announced(context.progress, f"int8: measuring the activation ranges of {len(convs)} Convs")
    feeds = context.range_feeds or context.feeds
    names = {v.name for conv in convs for v in (conv.input, conv.output)}
    ranges = measure_ranges(path, feeds, names, engine=context.engine, progress=shards)
    for conv in convs:
        x, y = ranges.get(conv.input.name), ranges.get(conv.output.name)
        if x is not None and y is not None:
            parts[conv.name] = parts[conv.name].measured(
                input_range=(x.low, x.high), output_range=(y.low, y.high), elements=y.elements
            )
    total = linear_flops + sum(p.flops for p in parts.values())
    conv_nodes = {conv.node for conv in convs}
    for conv in convs:
        part = parts[conv.name]
        x, y = ranges.get(conv.input.name), ranges.get(conv.output.name)
        share = part.flops / total if total else 1.0
        read_by_fp32 = conv.output.is_graph_output() or any(user not in conv_nodes for user, _ in conv.output.uses())
        why = _why_fp32(conv, part.facts, opset, share, read_by_fp32)
        if why is None and (x is None or y is None or not all(np.isfinite([x.low, x.high, y.low, y.high]))):
            why = "activation range not measured or not finite", "not measured"
        if why is not None:
            parts[conv.name] = part.decided(reason=why[0], kind=why[1])
        else:
            assert x is not None and y is not None
            parts[conv.name] = part.measured(plan=ConvPlan(*uint8_params(x.low, x.high), *uint8_params(y.low, y.high)))
    return parts


def _why_fp32(conv: Conv, facts: ConvFacts, opset: int, share: float, read_by_fp32: bool) -> tuple[str, str] | None:
    """(reason, its kind) where a Conv's form rules it out of int8."""
    if opset < MIN_OPSET:
        return f"opset {opset} < {MIN_OPSET} (no QuantizeLinear)", "opset"
    problem = int8_rank_problem(conv)
    if problem:
        return problem, f"{len(conv.shape) - 2}-D (int8 takes 1-D and 2-D Convs)"
    if conv.group > 1:
        return "grouped (depthwise) conv: its int8 kernel measured no faster", "grouped conv"
    if facts.depth < MIN_CONV_DEPTH:
        return f"too shallow ({facts.depth} multiply-adds per output < {MIN_CONV_DEPTH})", "too shallow"
    if read_by_fp32 and share < MIN_CONV_SHARE:
        return (
            f"{share:.2%} of the multiply-adds (< {MIN_CONV_SHARE:.0%}), its output read by fp32 ops: QLinearConv "
            "would round that output to one uint8 scale for little speed",
            "small, read by fp32",
        )
    return None
