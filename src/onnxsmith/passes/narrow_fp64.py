"""fp64 constants that only feed fp32 math are stored as fp32.

Exporters turn Python and numpy floats into double constants followed by a Cast
(or a CastLike) to float: the constant takes twice the bytes and is converted on
every run. When every reader of a double constant converts it to float32, the
constant is stored as what those readers compute — the same round-to-nearest
conversion, so the result is bit-identical — and the conversions go away.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.walk import const_tensor, rewritable_constants

FLOAT = ir.DataType.FLOAT
DOUBLE = ir.DataType.DOUBLE


@dataclass
class NarrowedConstant:
    name: str
    nbytes_before: int
    casts_removed: int


@dataclass
class NarrowFp64Result(ir.passes.PassResult):
    """What :class:`NarrowFp64ConstantsPass` did: the constants it stored as float32."""

    narrowed: list[NarrowedConstant] = field(default_factory=list)


class NarrowFp64ConstantsPass(ir.passes.InPlacePass):
    """Store double constants read only through a conversion to float32 as float32."""

    def call(self, model: ir.Model) -> NarrowFp64Result:
        narrowed = []
        for graph in model.graphs():
            for value in rewritable_constants(graph):
                uses = list(value.uses())
                if const_tensor(value).dtype != DOUBLE or not uses:
                    continue
                if all(_converts_to_float(use.node, use.idx) for use in uses):
                    narrowed.append(_narrow(value, [use.node for use in uses]))
        return NarrowFp64Result(model, bool(narrowed), narrowed)


def _narrow(value: ir.Value, casts: list[ir.Node]) -> NarrowedConstant:
    """``value`` stored as float32 and the conversions ``casts`` of it removed (where their outputs are not the graph's)."""
    tensor = const_tensor(value)
    nbytes = tensor.nbytes
    with np.errstate(over="ignore"):  # beyond fp32's range is inf, as the Cast made it
        narrowed = ir.tensor(tensor.numpy().astype(np.float32), name=value.name)
    producer = value.producer()
    if producer is None:
        value.const_value = narrowed
    else:  # a Constant node
        producer.attributes["value"] = ir.AttrTensor("value", narrowed)
    value.dtype = FLOAT
    removed = 0
    for cast in dict.fromkeys(casts):  # a node reading it twice is one node
        out = cast.outputs[0]
        if out.is_graph_output():
            continue  # keeps its name: now a float -> float Cast
        out.replace_all_uses_with(value)
        assert cast.graph is not None  # it reads a constant of a graph: it is in one
        cast.graph.remove(cast, safe=True)
        removed += 1
    return NarrowedConstant(value.name or "?", nbytes, removed)


def _converts_to_float(node: ir.Node, slot: int) -> bool:
    if node.domain not in ("", "ai.onnx") or slot != 0:
        return False
    if node.op_type == "Cast":
        return node.attributes.get_int("to") == FLOAT
    if node.op_type == "CastLike":
        target = node.inputs[1]
        return target is not None and target.dtype == FLOAT
    return False
