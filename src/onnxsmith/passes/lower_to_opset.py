"""Nodes a rewrite wrote in a form newer than the model's opset, rewritten in the model's own ops.

onnxscript's ORT fusions build what they need with today's ONNX: ``Shape(x, start=1, end=2)``
(its ``start``/``end`` attributes exist from opset 15) to size MultiHeadAttention's reshapes.
A TorchScript export at opset 14 (a T5 encoder) then holds a node its opset does not have:
onnx.checker and onnxruntime refuse the model. Rather than convert the whole model to a newer
opset (every op with a changed signature rewritten, for one attribute), each such node is
written the way the model's opset says it: ``Shape`` + ``Slice``, the same int64 values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.irutil.types import infer_types
from onnxsmith.irutil.walk import all_nodes, reachable

#: The opset from which Shape takes ``start`` and ``end``.
SHAPE_SLICE_OPSET = 15
#: The opset from which Slice takes its starts/ends/axes as inputs (before: attributes).
SLICE_INPUTS_OPSET = 10


@dataclass
class LowerToOpsetResult(ir.passes.PassResult):
    """What :class:`LowerToOpsetPass` did: how many nodes it rewrote."""

    lowered: int = 0


class LowerToOpsetPass(ir.passes.InPlacePass):
    """Rewrite every node that uses an op form newer than the model's default-domain opset (see the module doc)."""

    def call(self, model: ir.Model) -> LowerToOpsetResult:
        result = LowerToOpsetResult(model, False)
        opset = model.opset_imports.get("", model.graph.opset_imports.get("", SHAPE_SLICE_OPSET))
        if opset >= SHAPE_SLICE_OPSET:
            return result
        names = FreshNames(model.graph)
        lowered = []
        for node in list(all_nodes(model)):
            if node.op_type == "Shape" and node.domain in ("", "ai.onnx") and _has_range(node):
                lowered.append(_shape_then_slice(node, opset, names))
        if lowered:
            # Inference at the model's opset ignored start/end: what it said downstream is wrong.
            _forget_shapes_downstream(lowered)
            infer_types(model)
        result.lowered = len(lowered)
        result.modified = bool(lowered)
        return result


def _has_range(node: ir.Node) -> bool:
    return "start" in node.attributes or "end" in node.attributes


def _shape_then_slice(node: ir.Node, opset: int, names: FreshNames) -> ir.Value:
    """``Shape(x, start, end)`` -> ``Slice(Shape(x), [start], [end])``: Slice clamps as Shape's range does."""
    graph = node.graph
    assert graph is not None  # a node of the model (all_nodes)
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", np.iinfo(np.int64).max)
    shape = ir.node("Shape", [node.inputs[0]], num_outputs=1)
    shape.outputs[0].name = names(f"{node.outputs[0].name}/shape")
    if opset >= SLICE_INPUTS_OPSET:
        bounds = [
            add_initializer(graph, names(f"{node.outputs[0].name}/{what}"), np.array([v], np.int64))
            for what, v in (("start", start), ("end", end), ("axis", 0))
        ]
        piece = ir.node("Slice", [shape.outputs[0], *bounds], num_outputs=1)
    else:
        piece = ir.node(
            "Slice", [shape.outputs[0]], attributes={"starts": [start], "ends": [end], "axes": [0]}, num_outputs=1
        )
    graph.insert_before(node, [shape, piece])
    result, sliced = node.outputs[0], piece.outputs[0]
    name = result.name
    result.replace_all_uses_with(sliced, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    result.name = None
    sliced.name, sliced.type = name, result.type
    return sliced


def _forget_shapes_downstream(values: list[ir.Value]) -> None:
    """Every value computed from ``values`` (and they) loses its shape, to be inferred again."""
    for value in reachable(values, lambda v: [out for user in v.consumers() for out in user.outputs]):
        value.shape = None
