"""Name every dim after the input dims it follows (the batch stays 'batch' through a Reshape to -1).

onnx's shape inference cannot see through ``Reshape(x, [-1, 201, 2, 64])`` when
x's first dim is symbolic: the result's first dim is a fresh ``unk__N``, a
different one after every Reshape, and a rule that checks that q, k and v
share a batch size cannot match. This pass writes every value's shape as the
symbolic-shape engine (:mod:`onnxsmith.analysis.symbolic_shapes`) derives it: a
fixed size only where it is fixed at every input size, an input dim's name where
the dim is that input dim, an expression where it is one (``floor(width/4 - 1/4) + 1``
after a stride-4 convolution), unknown where the engine cannot tell. Never a size
that only happened to be equal at the sizes a model was run at: onnxruntime trusts
declared shapes, and a variant declaring a detector's ``floor(H/32)`` as 1 does not
run at a real size.
Unnamed symbolic input dims are named first (:func:`name_input_dims`).
"""

from __future__ import annotations

import onnx_ir as ir

from onnxsmith.analysis.symbolic_shapes import SymbolicShapes
from onnxsmith.irutil.types import infer_types


def name_input_dims(model: ir.Model) -> list[str]:
    """Give every unnamed symbolic dim of the graph inputs a name ('<input>_dim<axis>'); return all symbolic dim names."""
    names: list[str] = []
    for value in model.graph.inputs:
        if value.shape is None or value.const_value is not None:
            continue
        dims = list(value.shape)
        for axis, dim in enumerate(dims):
            if isinstance(dim, int):
                continue
            name = dim.value
            if not name or name == "?":  # unnamed (some exporters write a literal '?')
                name = f"{value.name}_dim{axis}"
                dims[axis] = ir.SymbolicDim(name)
            if name not in names:
                names.append(name)
        value.shape = ir.Shape(dims)
    return names


class NameDimsPass(ir.passes.InPlacePass):
    """Every value of the main graph gets the shape the symbolic-shape engine derives (see the module doc)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        infer_types(model)  # ranks and fixed sizes of ops the engine has no rule for
        shapes = SymbolicShapes(graph)
        modified = False
        for node in graph:
            for value in node.outputs:
                shape = shapes.shape(value)
                if shape is None or shape == value.shape:
                    continue
                value.shape = shape
                modified = True
        return ir.passes.PassResult(model, modified)
