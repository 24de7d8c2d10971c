"""Storage-faithful fp16 on a CPU: every fp16 tensor really passes through fp16.

onnxruntime's CPU provider has few fp16 kernels. For the rest it inserts
Cast(fp32) before and Cast(fp16) after each node, then removes the fp16 round
trips between consecutive nodes: a value that overflows fp16 (|x| > 65,504) on a
GPU is carried in fp32 on the CPU and the overflow is never seen.

This module rewrites a model so the CPU computes what fp16 storage computes:
each node that produced an fp16 tensor computes in fp32 and its result is
rounded through an explicit Cast(fp16) -> Cast(fp32) pair, which onnxruntime
keeps (checked by the tests). Values that overflow become inf exactly where a
GPU's would. Arithmetic inside a node runs in fp32, as fp16 GPU kernels
accumulate in fp32.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.casts import cast_node, insert_after_producer
from onnxsmith.irutil.types import ensure_types

#: Marks the Cast nodes this module inserts (node.meta), so measurements can see through them.
ROUNDING_MARK = "onnxsmith.fp16_rounding"
F16 = ir.DataType.FLOAT16
F32 = ir.DataType.FLOAT
# Attributes that name a dtype for the node's output.
_DTYPE_ATTRS = {
    "RandomNormal": "dtype",
    "RandomUniform": "dtype",
    "EyeLike": "dtype",
    "RandomNormalLike": "dtype",
    "RandomUniformLike": "dtype",
    "Multinomial": "dtype",
}


def has_fp16(model: ir.Model) -> bool:
    """Whether any weight, input, output or annotated value of the model is fp16."""
    for graph in model.graphs():
        for value in list(graph.inputs) + list(graph.outputs) + list(graph.initializers.values()):
            if value.dtype == F16:
                return True
        for node in graph:
            if node.op_type == "Cast" and node.attributes.get_int("to") == F16:
                return True
            if any(out.dtype == F16 for out in node.outputs):
                return True
            if node.op_type == "Constant":
                attr = node.attributes.get("value")
                if attr is not None and attr.type == ir.AttributeType.TENSOR and attr.value.dtype == F16:
                    return True
    return False


def emulate_fp16_storage(model: ir.Model) -> int:
    """Rewrite ``model`` in place so fp16 storage is emulated on CPU; return the number of rounding points."""
    ensure_types(model)
    rounded = 0
    for graph in list(model.graphs()):
        is_main = graph is model.graph
        _widen_constants(graph, is_main)
        for value in list(graph.inputs):
            if value.dtype != F16:
                continue
            if is_main:  # keep the model's interface; compute from an fp32 copy of the input
                wide = _cast(graph, value, F32, name=f"{value.name}/fp32")
                _redirect_uses(value, wide, skip=wide.producer())
            else:  # a subgraph's formal input carries a value already rounded outside
                value.dtype = F32
        for node in list(graph):
            for out in node.outputs:
                if out.dtype == F16:
                    _round(graph, node, out, is_main)
                    rounded += 1
    return rounded


def _widen_constants(graph: ir.Graph, is_main: bool) -> None:
    """fp16 weights are read as fp32 (exactly: every fp16 value is an fp32 value).

    The main graph's weights stay fp16 and get a Cast to fp32, so a big model's weights
    are never held twice: runtime/runner.py feeds them to onnxruntime as they are stored,
    and each Cast's output lives only while its node runs. A subgraph's (small) weights
    and Constant nodes are widened in place.
    """
    for value in list(graph.initializers.values()):
        if value.dtype != F16 or value.const_value is None:
            continue
        if is_main:
            wide = _cast(graph, value, F32, name=f"{value.name}/fp32")
            _redirect_uses(value, wide, skip=wide.producer())
        else:
            value.const_value = ir.tensor(value.const_value.numpy().astype(np.float32), name=value.name)
            value.dtype = F32
    for node in graph:
        for key, attr in list(node.attributes.items()):
            if attr.type == ir.AttributeType.TENSOR and attr.value.dtype == F16:
                wide = ir.tensor(attr.value.numpy().astype(np.float32), name=attr.value.name)
                node.attributes[key] = ir.AttrTensor(key, wide)


def _round(graph: ir.Graph, node: ir.Node, out: ir.Value, is_main: bool) -> None:
    """Make ``out`` (fp16 in the model) an fp32 value that holds exactly its fp16 rounding."""
    if node.op_type == "Cast":
        half = out  # the Cast itself rounds to fp16; its consumers get it widened
    else:
        attr_name = _DTYPE_ATTRS.get(node.op_type)
        if attr_name and node.attributes.get_int(attr_name) == F16:
            node.attributes[attr_name] = ir.AttrInt64(attr_name, int(F32))
        out.dtype = F32
        name = out.name
        out.name = f"{name}/fp32"
        half = _cast(graph, out, F16, name=name)
    wide = _cast(graph, half, F32, name=f"{half.name}/rounded")
    _redirect_uses(out, half, skip=half.producer())
    _redirect_uses(half, wide, skip=wide.producer())
    for i, value in enumerate(graph.outputs):
        if value is out or value is half:
            # The model's outputs keep their fp16 type; a subgraph hands fp32 to its fp32 parent.
            graph.outputs[i] = half if is_main else wide


def _redirect_uses(value: ir.Value, new: ir.Value, *, skip: ir.Node | None) -> None:
    for user, index in list(value.uses()):
        if user is not skip:
            user.replace_input_with(index, new)


def _cast(graph: ir.Graph, value: ir.Value, to: ir.DataType, *, name: str) -> ir.Value:
    node = cast_node(value, to, name=name)
    node.meta[ROUNDING_MARK] = True
    insert_after_producer(graph, value, node)
    return node.outputs[0]
