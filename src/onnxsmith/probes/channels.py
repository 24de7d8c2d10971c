"""Where a transformer's massive activation lives: per-channel max |x| of the residual stream.

Some ViTs and LLMs carry one or two residual-stream channels at values far
beyond the rest (DINOv3 ViT-L's channel 757 sits above fp16's 65,504 on every
token). The residual stream is what the normalisation layers read, so those
tensors (few, and small next to the model's weights) are exposed as outputs,
and the max |x| of each channel is taken over every other axis.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxsmith.io.load import load_model
from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.types import FLOAT_TYPES
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import adapt_feeds

#: Normalisation ops whose first input is the residual stream.
NORM_OPS = frozenset(
    {
        "LayerNormalization",
        "SimplifiedLayerNormalization",
        "RMSNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
    }
)


@dataclass
class ChannelPeaks:
    tensor: str
    reader: str  # the normalisation node that reads it
    order: int  # position of the node producing it, in graph order
    absmax: float
    channel: int  # the channel holding absmax
    channel_absmax: float
    per_channel: list[float]
    nonfinite: int


def residual_stream(model: ir.Model) -> list[tuple[ir.Value, ir.Node, int]]:
    """Inputs of the main graph's normalisation nodes: (value, reader, order of its producer)."""
    order_of = {node: i for i, node in enumerate(model.graph)}
    found: dict[ir.Value, tuple[ir.Value, ir.Node, int]] = {}
    for node in model.graph:
        if node.op_type not in NORM_OPS or not node.inputs or node.inputs[0] is None:
            continue
        value = node.inputs[0]
        producer = value.producer()
        if producer is None or value in found or value.dtype not in FLOAT_TYPES | {None}:
            continue
        found[value] = (value, node, order_of.get(producer, -1))
    return list(found.values())


def residual_channel_peaks(
    model_path: str | os.PathLike, feeds_list: list[dict[str, np.ndarray]]
) -> list[ChannelPeaks]:
    """Per-channel max |x| (last axis) of each residual-stream tensor over every input set, in graph order."""
    model = load_model(model_path)
    original = load_model(model_path)
    targets = residual_stream(model)
    if not targets:
        return []
    outputs = {v.name for v in model.graph.outputs}
    for value, _, _ in targets:
        if value.name not in outputs:
            model.graph.outputs.append(value)
    names = [value.name for value, _, _ in targets]
    session = runner.open_session(model, label=model_path)
    peaks: dict[str, np.ndarray] = {}
    nonfinite: dict[str, int] = {}
    for feeds in feeds_list:
        results = runner.run(session, adapt_feeds(feeds, original), names, label=model_path)
        for name, array in results.items():
            x = np.abs(np.asarray(array, dtype=np.float64))
            bad = ~np.isfinite(x)
            nonfinite[name] = nonfinite.get(name, 0) + int(bad.sum())
            x[bad] = 0.0
            per_channel = x.reshape(-1, x.shape[-1]).max(axis=0) if x.ndim and x.size else np.zeros(1)
            peaks[name] = per_channel if name not in peaks else np.maximum(peaks[name], per_channel)
    found = []
    for value, reader, order in sorted(targets, key=lambda t: t[2]):
        per_channel = peaks[value.name]
        channel = int(np.argmax(per_channel))
        found.append(
            ChannelPeaks(
                tensor=value.name,
                reader=node_label(reader),
                order=order,
                absmax=float(per_channel.max()),
                channel=channel,
                channel_absmax=float(per_channel[channel]),
                per_channel=[float(v) for v in per_channel],
                nonfinite=nonfinite[value.name],
            )
        )
    return found
