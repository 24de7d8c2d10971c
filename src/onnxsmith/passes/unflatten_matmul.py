"""A linear layer on [batch, sequence, K] needs no Reshape to 2-D and back: MatMul broadcasts.

optimum's GPT-2 export writes every linear layer as ``Gemm`` on a 2-D input, wrapped in
``Reshape(x, [-1, K])`` ... ``Reshape(y, [batch, sequence, N])``, the second target built
from ``Shape(x)`` by a chain of Gather/Unsqueeze/Slice/Squeeze/Concat: 13 nodes where,
once the Gemm is a MatMul (passes/gemm_to_matmul.py), 2 do the same work::

    Reshape(x, [-1, K]) -> MatMul(., W) [-> Add(., bias)] -> Reshape(., x.shape[:-1] + [N])
    ==>  MatMul(x, W) [-> Add(., bias)]

``MatMul`` with a 2-D W multiplies every row of the leading dims and keeps them, so the
rewrite is exact. It applies only when analysis/symbolic_shapes.py proves both Reshapes:
the first keeps x's last dim (K) and flattens the rest, the second restores x's leading
dims and appends W's N; the bias must broadcast the same way on 3-D ([N], [1, N] or a
scalar); and nothing else reads the 2-D intermediates. In the small graphs of a web LM
each removed node is a kernel launch per token (~2 us in onnxruntime-web's WASM).
"""

from __future__ import annotations

from typing import TypeGuard

import onnx_ir as ir

from onnxsmith.analysis.symbolic_shapes import Dim, SymbolicShapes, as_int, is_int, same
from onnxsmith.passes import Rewritten


class UnflattenMatMulPass(ir.passes.InPlacePass):
    """Remove the Reshape pair around every MatMul (+ bias Add) that broadcasts without it (see the module doc)."""

    def call(self, model: ir.Model) -> Rewritten:
        graph = model.graph
        shapes = SymbolicShapes(graph)
        rewritten = 0
        for matmul in list(graph):
            if matmul.op_type == "MatMul" and matmul.domain in ("", "ai.onnx") and matmul.graph is graph:
                match = _match(graph, shapes, matmul)
                if match is not None:
                    _rewrite(graph, shapes, *match)
                    rewritten += 1
        return Rewritten(model, rewritten > 0, rewritten)


def _only_reader(graph: ir.Graph, value: ir.Value) -> ir.Node | None:
    """The single node reading ``value`` (once), if it is not also a graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value in graph.outputs:
        return None
    return uses[0][0]


def _is(node: ir.Node | None, op_type: str) -> TypeGuard[ir.Node]:
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _match(
    graph: ir.Graph, shapes: SymbolicShapes, matmul: ir.Node
) -> tuple[ir.Node, ir.Node, ir.Node | None, ir.Node, ir.Node] | None:
    flatten = matmul.inputs[0].producer() if matmul.inputs[0] is not None else None
    if not _is(flatten, "Reshape") or _only_reader(graph, flatten.outputs[0]) is not matmul:
        return None
    x = flatten.inputs[0]
    x_dims, flat_dims, w_dims = shapes.dims(x), shapes.dims(flatten.outputs[0]), shapes.dims(matmul.inputs[1])
    if (
        x_dims is None
        or len(x_dims) < 2
        or flat_dims is None
        or len(flat_dims) != 2
        or w_dims is None
        or len(w_dims) != 2
    ):
        return None
    if not same(flat_dims[1], x_dims[-1]):  # the flattening must keep x's rows intact
        return None
    add: ir.Node | None
    last, add = matmul, None
    reader = _only_reader(graph, matmul.outputs[0])
    if _is(reader, "Add"):
        bias = reader.inputs[1] if reader.inputs[0] is matmul.outputs[0] else reader.inputs[0]
        if not _broadcasts_as_bias(shapes.dims(bias)):
            return None
        last, add = reader, reader
        reader = _only_reader(graph, reader.outputs[0])
    if not _is(reader, "Reshape"):
        return None
    restore = reader
    out_dims = shapes.dims(restore.outputs[0])
    if out_dims is None or len(out_dims) != len(x_dims):
        return None
    if not all(same(a, b) for a, b in zip(out_dims[:-1], x_dims[:-1])) or not same(out_dims[-1], w_dims[1]):
        return None
    return flatten, matmul, add, restore, last


def _broadcasts_as_bias(dims: tuple[Dim, ...] | None) -> bool:
    """A bias that broadcasts against [rows, N] exactly as against [..., rows, N]: it has no rows dim."""
    if dims is None or len(dims) > 2:
        return False
    return len(dims) < 2 or (is_int(dims[0]) and as_int(dims[0]) == 1)


def _rewrite(
    graph: ir.Graph,
    shapes: SymbolicShapes,
    flatten: ir.Node,
    matmul: ir.Node,
    add: ir.Node | None,
    restore: ir.Node,
    last: ir.Node,
) -> None:
    matmul.replace_input_with(0, flatten.inputs[0])
    result, kept = restore.outputs[0], last.outputs[0]
    name, shape, dims = result.name, result.shape, shapes.dims(result)
    result.replace_all_uses_with(kept, replace_graph_outputs=True)
    graph.remove([restore, flatten], safe=True)
    result.name = None
    kept.name = name  # the layer's output keeps its name (it may be a graph output)
    kept.shape = shape
    shapes.update(kept, dims)
    if add is not None:  # the MatMul's own output is 3-D now, like the layer's
        matmul.outputs[0].shape = None
        shapes.update(matmul.outputs[0], dims)
