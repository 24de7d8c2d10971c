"""``fuse --precision fp16``: a fused graph in fp16, its residual stream and normalisations fp32.

Built on the fp16 transform's passes: the residual rescaling (passes/residual_rescale.py)
runs on the unfused graph, where the stream is a chain of Adds read by LayerNorms
(:func:`rescale_residual_streams`); the converter (passes/float_precision.py) then runs on
the fused graph with the fuse policy (:func:`fused_to_fp16`). Both take measured ranges.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxsmith.analysis.measurements import TensorRange
from onnxsmith.analysis.precision_policy import Limits, policy_reason, unsafe_activations
from onnxsmith.core.transform import Progress
from onnxsmith.irutil.types import infer_types
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes.cast_hygiene import CastHygienePass
from onnxsmith.passes.float_precision import FloatPrecisionPass
from onnxsmith.passes.residual_rescale import choose_scale, find_residual_streams, rescale_residual

#: Normalisations compute in fp32 (they read the fp32 residual stream and reduce over it).
_FP32_OPS = frozenset({"LayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})


def rescale_residual_streams(model: ir.Model, ranges: list[TensorRange]) -> list[str]:
    """Scale a residual stream that overflows fp16 by a power of two, so the fp16 projections writing it fit."""
    limits = Limits.for_dtype(ir.DataType.FLOAT16)
    measured = {r.name: r.absmax for r in ranges}
    notes = []
    infer_types(model)
    for stream in find_residual_streams(model):
        peak = max((measured.get(v.name, 0.0) for v in stream.values), default=0.0)
        if peak <= limits.max_abs:
            continue
        if stream.problem is not None:
            notes.append(f"residual stream peaks at {peak:.3g} but is not rescaled: {stream.problem}")
            continue
        writers = max((measured.get(v.name, 0.0) for v in stream.scaled), default=0.0)
        scale = choose_scale(max(peak, writers), limits.max_abs)
        rescale_residual(model, stream, scale)
        notes.append(
            f"residual stream ({stream.describe()}, measured peak {peak:.3g}) carried scaled by "
            f"1/{round(1 / scale)} so the fp16 projections that write it fit"
        )
    return notes


def fused_to_fp16(model: ir.Model, ranges: list[TensorRange], progress: Progress) -> list[str]:
    """MatMul, attention, RoPE, BiasGelu in fp16; the residual stream and the normalisations in fp32.

    ``ranges``: the fused fp32 graph's, measured.
    """
    limits = Limits.for_dtype(ir.DataType.FLOAT16)
    keep = _fused_residual_stream(model)
    unsafe = unsafe_activations(ranges, limits)
    for name, why in unsafe.items():
        keep.setdefault(name, why.reason)
    head = _per_sample_tail(model)

    def policy(node: ir.Node) -> str | None:
        if node.op_type in _FP32_OPS and node.domain in ("", "ai.onnx", "com.microsoft"):
            return "normalisation (fuse keeps LayerNorms fp32)"
        if node in head:
            return "after the token row is selected: one vector per sample, fp32 costs nothing"
        return policy_reason(node)

    progress("fuse: converting to fp16")
    precision = FloatPrecisionPass(ir.DataType.FLOAT16, keep_fp32=keep, policy=policy, limits=limits)(model)
    casts = CastHygienePass()(model).counts
    low = precision.low_nodes
    return [
        f"fp16: {sum(low.values())} nodes compute in fp16 ({', '.join(f'{op} {n}' for op, n in low.most_common())}); "
        f"{len(precision.kept)} stay fp32 (residual stream, normalisations"
        + (f", {len(unsafe)} tensors measured out of fp16's range" if unsafe else "")
        + ")",
        f"casts: {precision.casts_added} inserted; {casts.describe()}",
    ]


def _fused_residual_stream(model: ir.Model) -> dict[str, str]:
    """The residual stream of a fused graph: what SkipLayerNormalization adds to (its skip) and its sums."""
    keep: dict[str, str] = {}
    for node in model.graph:
        if node.domain == "com.microsoft" and node.op_type in _FP32_OPS:
            keep[node.inputs[1].name] = "residual stream"
            if len(node.outputs) > 3 and node.outputs[3].uses():
                keep[node.outputs[3].name] = "residual stream"
    return keep


def _per_sample_tail(model: ir.Model) -> set[ir.Node]:
    """Nodes from a Gather that picks one token row on (a CLS head): they see one vector per sample."""
    tail: set[ir.Node] = set()
    for node in model.graph:  # topological: a node's producers come first
        if _picks_a_row(node) or any(v is not None and v.producer() in tail for v in node.inputs):
            tail.add(node)
    return tail


def _picks_a_row(node: ir.Node) -> bool:
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.inputs[0].shape is None:
        return False
    rank = node.inputs[0].shape.rank()
    index = const_array(node.inputs[1])
    return rank >= 3 and index is not None and index.ndim == 0 and node.attributes.get_int("axis", 0) in (rank - 2, -2)
