"""Walking a model: every node (subgraphs included), every constant, every value's type."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


def all_nodes(model_or_graph: ir.Model | ir.Graph) -> Iterator[ir.Node]:
    """Every node, recursing into If/Loop/Scan subgraphs (parents before their subgraphs)."""
    graph = model_or_graph.graph if isinstance(model_or_graph, ir.Model) else model_or_graph
    yield from ir.traversal.RecursiveGraphIterator(graph)


def subgraphs_of(node: ir.Node) -> list[ir.Graph]:
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.value)
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.value)
    return graphs


@dataclass
class ConstantTensor:
    """A weight, wherever the exporter put it."""

    value: ir.Value
    tensor: ir.TensorProtocol
    node: ir.Node | None  # the Constant node holding it, None for an initializer

    @property
    def kind(self) -> str:
        return "initializer" if self.node is None else "Constant node"


def constant_tensors(model: ir.Model) -> Iterator[ConstantTensor]:
    """Initializers and Constant-node tensors of every graph (PP-OCR keeps all its weights in Constants)."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if value.const_value is not None:
                yield ConstantTensor(value, value.const_value, None)
        for node in graph:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                attr = node.attributes.get("value")
                if attr is not None and attr.type == ir.AttributeType.TENSOR:
                    yield ConstantTensor(node.outputs[0], attr.value, node)


def node_label(node: ir.Node) -> str:
    """How a node is named in messages: its name, else its op and first output."""
    if node.name:
        return node.name
    first = node.outputs[0].name if node.outputs else "?"
    return f"{node.op_type}->{first}"


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken``, which records it."""
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def const_array(value: ir.Value | None):
    """The numpy value of a constant (initializer or Constant node output), else None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def infer_types(model: ir.Model) -> None:
    """Give every value a dtype (and a shape where onnx can tell).

    onnx's inference first (not strict: it skips ops it does not know), then a
    fallback for what it left untyped, e.g. com.microsoft fusions: an output has the
    type of the node's first floating-point input. That rule holds for the contrib
    ops onnxsmith writes (MultiHeadAttention, RotaryEmbedding, SkipLayerNormalization,
    BiasGelu, MatMulNBits). The elementwise ones and MultiHeadAttention get shapes too.
    """
    logging.getLogger("onnx_ir.passes.common.shape_inference").setLevel(logging.ERROR)
    for _ in range(4):  # each round types what the previous fallback unblocked
        ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
        if not _type_unknown_op_outputs(model):
            return


def ensure_types(model: ir.Model) -> None:
    """:func:`infer_types`, unless every value that is read already has a dtype.

    Exporters write every value's type, and so does onnxsmith: inference then adds
    nothing a reader of dtypes needs, and on a big model it takes a while (a third of a
    second per call on ViT-L). Shapes are not completed: callers that need them use
    :func:`infer_types`.
    """
    for graph in model.graphs():
        for node in graph:
            if any(out.dtype is None and (out.uses() or out.is_graph_output()) for out in node.outputs):
                infer_types(model)
                return


def _type_unknown_op_outputs(model: ir.Model) -> bool:
    changed = False
    for graph in model.graphs():
        for node in graph:
            if node.domain in ("", "ai.onnx"):
                continue
            first_float = next((v.dtype for v in node.inputs if v is not None and v.dtype in FLOAT_TYPES), None)
            for out in node.outputs:
                if out.dtype is None and first_float is not None:
                    out.dtype = first_float
                    changed = True
            changed |= _shape_contrib_outputs(node)
    return changed


#: com.microsoft ops whose listed outputs have the shape of their first input.
_SHAPE_OF_FIRST_INPUT = {
    "RotaryEmbedding": (0,),
    "BiasGelu": (0,),
    "Gelu": (0,),
    "FastGelu": (0,),
    "QuickGelu": (0,),
    "SkipLayerNormalization": (0, 3),
    "SkipSimplifiedLayerNormalization": (0, 3),
}


def _shape_contrib_outputs(node: ir.Node) -> bool:
    """Shapes onnx cannot infer for the contrib ops the fusions write, so inference flows past them."""
    if node.domain != "com.microsoft" or not node.inputs or node.inputs[0] is None:
        return False
    shape = node.inputs[0].shape
    indices = _SHAPE_OF_FIRST_INPUT.get(node.op_type, ())
    if node.op_type == "MultiHeadAttention" and len(node.inputs) > 2 and node.inputs[2] is not None:
        value = node.inputs[2].shape  # [batch, kv_tokens, v_hidden]: the result has the query's tokens
        if shape is not None and value is not None and shape.rank() == 3 and value.rank() == 3:
            shape, indices = ir.Shape([shape[0], shape[1], value[2]]), (0,)
    changed = False
    for i in indices:
        if shape is not None and i < len(node.outputs) and node.outputs[i].shape is None:
            node.outputs[i].shape = ir.Shape(shape)
            changed = True
    return changed
