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
        self._result = NarrowFp64Result(model, False)  # filled while the pass runs
        for graph in model.graphs():
            for value in _double_constants(graph):
                uses = list(value.uses())
                if uses and all(_converts_to_float(use.node, use.idx) for use in uses):
                    self._narrow(graph, value, [use.node for use in uses])
        self._result.modified = bool(self._result.narrowed)
        return self._result

    def _narrow(self, graph: ir.Graph, value: ir.Value, casts: list[ir.Node]) -> None:
        tensor = ir.convenience.get_const_tensor(value)
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
            cast.graph.remove(cast, safe=True)
            removed += 1
        self._result.narrowed.append(NarrowedConstant(value.name or "?", nbytes, removed))


def _double_constants(graph: ir.Graph) -> list[ir.Value]:
    values = [v for v in graph.initializers.values() if v.const_value is not None]
    for node in graph:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and "value" in node.attributes:
            values.append(node.outputs[0])
    return [
        v
        for v in values
        if ir.convenience.get_const_tensor(v).dtype == DOUBLE and not v.is_graph_input() and not v.is_graph_output()
    ]


def _converts_to_float(node: ir.Node, slot: int) -> bool:
    if node.domain not in ("", "ai.onnx") or slot != 0:
        return False
    if node.op_type == "Cast":
        return node.attributes.get_int("to") == FLOAT
    if node.op_type == "CastLike":
        target = node.inputs[1]
        return target is not None and target.dtype == FLOAT
    return False
