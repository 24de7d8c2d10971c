"""Activation ranges: the largest |x| of every float tensor, measured by running the model.

Exposing every intermediate tensor as an output would copy all of them out of
onnxruntime (gigabytes for a ViT-L). Instead the model is instrumented: each
float tensor gets a few reductions (max |x|, count of NaN/inf, fraction of
values too small for fp16) whose scalar results are the only extra outputs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.graph import FLOAT_TYPES, infer_types, node_label
from onnxsmith.io.load import load_model
from onnxsmith.verify import runner
from onnxsmith.verify.fp16_storage import ROUNDING_MARK, emulate_fp16_storage, has_fp16
from onnxsmith.verify.inputs import adapt_feeds

#: Smallest positive normal fp16; below it values lose precision, below 2**-24 they vanish.
FP16_MIN_NORMAL = 2.0**-14
_SUFFIXES = ("absmax", "nonfinite", "tiny")


@dataclass
class TensorRange:
    name: str
    node: str  # the node that produces it ("" for a graph input)
    op_type: str
    order: int  # position of the producer in the graph's topological order
    absmax: float  # over all input sets; NaN/inf excluded
    nonfinite: int  # NaN/inf values seen
    tiny_fraction: float  # share of nonzero values below fp16's smallest normal
    dtype: str


def instrument(model: ir.Model, values: list[ir.Value]) -> list[str]:
    """Add reduction outputs for ``values`` (main graph); return the output names added."""
    graph = model.graph
    added = []
    for value in values:
        x = value
        if value.dtype != ir.DataType.FLOAT:
            x = _append(graph, "Cast", [x], {"to": int(ir.DataType.FLOAT)})
        absolute = _append(graph, "Abs", [x])
        finite = _append(graph, "Not", [_append(graph, "Or", [_append(graph, "IsNaN", [x]), _append(graph, "IsInf", [x])])])
        zero = _const(graph, np.float32(0.0))
        # max |x| over the finite values (NaN/inf counted separately)
        clean = _append(graph, "Where", [finite, absolute, zero])
        absmax = _append(graph, "ReduceMax", [clean], {"keepdims": 0}, name=f"{value.name}::absmax")
        bad = _append(graph, "Cast", [_append(graph, "Not", [finite])], {"to": int(ir.DataType.FLOAT)})
        nonfinite = _append(graph, "ReduceSum", [bad], {"keepdims": 0}, name=f"{value.name}::nonfinite")
        nonzero = _append(graph, "Greater", [clean, zero])
        small = _append(graph, "Less", [clean, _const(graph, np.float32(FP16_MIN_NORMAL))])
        tiny_mask = _append(graph, "Cast", [_append(graph, "And", [nonzero, small])], {"to": int(ir.DataType.FLOAT)})
        nonzero_f = _append(graph, "Cast", [nonzero], {"to": int(ir.DataType.FLOAT)})
        tiny_count = _append(graph, "ReduceSum", [tiny_mask], {"keepdims": 0}, name=f"{value.name}::tiny")
        nonzero_count = _append(graph, "ReduceSum", [nonzero_f], {"keepdims": 0}, name=f"{value.name}::nonzero")
        for out in (absmax, nonfinite, tiny_count, nonzero_count):
            graph.outputs.append(out)
            added.append(out.name)
    return added


def _append(graph: ir.Graph, op: str, inputs, attributes=None, *, name: str | None = None) -> ir.Value:
    node = ir.node(op, inputs, attributes=attributes or {}, num_outputs=1)
    graph.append(node)
    out = node.outputs[0]
    out.name = name or f"onnxsmith::{op}_{len(graph)}"
    return out


def _const(graph: ir.Graph, value: np.generic) -> ir.Value:
    node = ir.node("Constant", [], attributes={"value": ir.tensor(np.asarray(value))}, num_outputs=1)
    graph.append(node)
    node.outputs[0].name = f"onnxsmith::const_{len(graph)}"
    return node.outputs[0]


def measurable_values(model: ir.Model) -> list[tuple[ir.Value, ir.Node | None, int]]:
    """Float tensors of the main graph worth measuring, with the node to blame and its order.

    In a storage-faithful model each fp16 tensor appears once, under its own
    name, as the Cast that rounds it; it is blamed on the node that computed it.
    """
    found = [(v, None, -1) for v in model.graph.inputs if v.dtype in FLOAT_TYPES]
    order_of: dict[ir.Node, int] = {}
    for order, node in enumerate(model.graph):
        order_of[node] = order
        if node.op_type == "Constant":
            continue
        blamed, position = node, order
        if node.meta.get(ROUNDING_MARK):
            if node.attributes.get_int("to") != ir.DataType.FLOAT16:
                continue  # the widening back to fp32 carries the same values
            blamed = node.inputs[0].producer()
            position = order_of.get(blamed, -1) if blamed is not None else -1
        elif any(out.uses() and all(u.meta.get(ROUNDING_MARK) for u, _ in out.uses()) for out in node.outputs):
            continue  # an fp32 result that exists only to be rounded: measured after rounding
        for out in node.outputs:
            if out.dtype in FLOAT_TYPES and out.name:
                found.append((out, blamed, position))
    return found


def measure_ranges(
    model_path: str | os.PathLike,
    feeds_list: list[dict[str, np.ndarray]],
    *,
    fp16_storage: bool | None = None,
) -> list[TensorRange]:
    """Run ``model_path`` on every input set and return each float tensor's range, in graph order.

    ``fp16_storage``: emulate fp16 storage (default: when the model has fp16 tensors),
    so the ranges are those a GPU would see, overflow included.
    """
    model = load_model(model_path)
    original = load_model(model_path)
    if fp16_storage is None:
        fp16_storage = has_fp16(model)
    if fp16_storage:
        emulate_fp16_storage(model)
    else:
        infer_types(model)
    targets = measurable_values(model)
    names = instrument(model, [v for v, _, _ in targets])
    session = runner.open_session(model, label=model_path)
    stats: dict[str, dict[str, float]] = {}
    for feeds in feeds_list:
        results = runner.run(session, adapt_feeds(feeds, original), names, label=model_path)
        for name, array in results.items():
            tensor, _, suffix = name.rpartition("::")
            entry = stats.setdefault(tensor, {"absmax": 0.0, "nonfinite": 0.0, "tiny": 0.0, "nonzero": 0.0})
            value = float(array)
            entry[suffix] = max(entry[suffix], value) if suffix == "absmax" else entry[suffix] + value
    ranges = []
    for value, node, order in targets:
        entry = stats[value.name]
        ranges.append(
            TensorRange(
                name=value.name,
                node=node_label(node) if node is not None else "",
                op_type=node.op_type if node is not None else "input",
                order=order,
                absmax=entry["absmax"],
                nonfinite=int(entry["nonfinite"]),
                tiny_fraction=entry["tiny"] / entry["nonzero"] if entry["nonzero"] else 0.0,
                dtype=value.dtype.name if value.dtype else "?",
            )
        )
    return ranges
