"""A Reshape target computed from shapes becomes a constant: 0 copies a dim, literals stay.

Exporters compute every Reshape's target at run time: optimum's GPT-2 splits the heads
with ``Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)),
[-1], [64]))``, four to six nodes re-evaluated on every call for one Reshape. Knowing
what the chain computes (analysis/symbolic_shapes.py) the target is ``[0, 0, -1, 64]``:
each element that is the input's dim at the same place becomes 0 (Reshape's "copy this
dim"), integers stay, and the chain is left to the dead-node cleanup.

A target is only replaced when *every* element is accounted for that way: a new -1 is
never introduced, because -1 cannot be inferred when another dim is 0 at run time (an
empty KV cache), where the computed target still worked. A Reshape with ``allowzero=1``
keeps its target unless it is made of integers only.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.symbolic_shapes import SymbolicShapes, as_int, is_int, same
from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.passes import Rewritten


class ConstantReshapeTargetsPass(ir.passes.InPlacePass):
    """Replace every computed Reshape target of the main graph that the analysis knows (see the module doc)."""

    def call(self, model: ir.Model) -> Rewritten:
        graph = model.graph
        shapes = SymbolicShapes(graph)
        constants: dict[tuple[int, ...], ir.Value] = {}
        names = FreshNames(graph)
        replaced = 0
        for node in graph:
            if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
                continue
            target = node.inputs[1]
            if target is None or ir.convenience.get_const_tensor(target) is not None:
                continue
            literal = constant_target(shapes, node)
            if literal is None:
                continue
            if literal not in constants:
                array = np.array(literal, dtype=np.int64)
                constants[literal] = add_initializer(graph, names(f"{node.name or 'Reshape'}/target"), array)
            node.replace_input_with(1, constants[literal])
            replaced += 1
        return Rewritten(model, replaced > 0, replaced)


def constant_target(shapes: SymbolicShapes, reshape: ir.Node) -> tuple[int, ...] | None:
    """The constant target equivalent to ``reshape``'s computed one, or None."""
    elements = shapes.shape_value(reshape.inputs[1])
    if elements is None:
        return None
    data = shapes.dims(reshape.inputs[0])
    allow_zero = reshape.attributes.get_int("allowzero", 0)
    literal = []
    for i, element in enumerate(elements):
        if is_int(element):
            literal.append(as_int(element))
        elif not allow_zero and data is not None and i < len(data) and same(element, data[i]):
            literal.append(0)
        else:
            return None
    return tuple(literal)
