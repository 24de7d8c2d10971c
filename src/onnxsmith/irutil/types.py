"""Every value's type: onnx's inference, with a fallback for the contrib ops onnxsmith writes."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


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


def set_dtype(value: ir.Value, dtype: ir.DataType | None) -> None:
    """``value.dtype = dtype``, None included: a rewrite copies its source's dtype, known or not.

    onnx-ir's setter is annotated without None but stores it all the same.
    """
    value.dtype = dtype  # type: ignore[assignment]  # onnx-ir's setter is typed without None, takes it


def typed_values(model: ir.Model) -> set[ir.Value]:
    """The values whose type the model states (before :func:`infer_types` adds the rest)."""
    return {v for v in _inner_values(model) if v.type is not None or v.shape is not None}


def forget_inferred_types(model: ir.Model, stated: set[ir.Value]) -> int:
    """Drop the types and shapes of inner values not in ``stated``; how many were dropped.

    Inferred shapes are written as value_info: on a small model that is a few percent of
    the file (magika: 10 KB of 3 MB). A variant that must not grow keeps only what its
    source stated (updated where a pass changed a type), and the outputs of operators
    onnx's inference does not know (com.microsoft fusions), past which it could not
    infer the rest; any reader infers the rest.
    """
    dropped = 0
    for value in _inner_values(model):
        producer = value.producer()
        if producer is not None and producer.domain not in ("", "ai.onnx"):
            continue
        if value not in stated and (value.type is not None or value.shape is not None):
            value.type = None
            value.shape = None
            dropped += 1
    return dropped


def _inner_values(model: ir.Model) -> Iterator[ir.Value]:
    """Values computed by nodes that are not graph outputs (what is written as value_info)."""
    for graph in model.graphs():
        for node in graph:
            for value in node.outputs:
                if not value.is_graph_output():
                    yield value


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
