"""Gemm -> MatMul (+ Add): every linear layer's weight becomes a plain [K, N] MatMul constant.

Exporters write a 2-D linear layer as ``Gemm`` (GPT-2's Conv1D body in an optimum
export, ``nn.Linear`` on flattened inputs). Weight quantization and onnxruntime's
DequantizeLinear+MatMul fusion look for ``MatMul(x, W)`` with W [K, N]; this pass
rewrites ``Gemm(A, B, C, alpha, beta, transA, transB)`` into that shape:

* a constant B read with ``transB=1`` is stored transposed (once, even if several
  Gemms share it); a computed B gets a Transpose node;
* ``alpha`` and ``beta`` are folded into constant B and C, else become a Mul;
* ``transA=1`` becomes a Transpose of A;
* C, if any, becomes an Add after the MatMul (Gemm's broadcast of C is Add's).

The Gemm's output value keeps its name, so nothing downstream changes.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes import Rewritten


class GemmToMatMulPass(ir.passes.InPlacePass):
    """Rewrite every Gemm of every graph as MatMul (+ Add); see the module doc."""

    def call(self, model: ir.Model) -> Rewritten:
        rewritten = 0
        for graph in model.graphs():
            transposed: dict[ir.Value, ir.Value] = {}
            names = FreshNames(graph)
            for node in list(graph):
                if node.op_type == "Gemm" and node.domain in ("", "ai.onnx"):
                    self._rewrite(graph, node, transposed, names)
                    rewritten += 1
        return Rewritten(model, rewritten > 0, rewritten)

    def _rewrite(self, graph: ir.Graph, gemm: ir.Node, transposed: dict[ir.Value, ir.Value], names: FreshNames) -> None:
        a, b = gemm.inputs[0], gemm.inputs[1]
        c = gemm.inputs[2] if len(gemm.inputs) > 2 else None
        alpha = gemm.attributes.get_float("alpha", 1.0)
        beta = gemm.attributes.get_float("beta", 1.0)
        trans_a = gemm.attributes.get_int("transA", 0)
        trans_b = gemm.attributes.get_int("transB", 0)
        label = gemm.name or (gemm.outputs[0].name or "Gemm")
        new_nodes: list[ir.Node] = []

        if trans_a:
            node = ir.node("Transpose", [a], {"perm": [1, 0]}, name=f"{label}/TransposeA")
            new_nodes.append(node)
            a = node.outputs[0]

        b_array = const_array(b) if _is_initializer(graph, b) else None
        if b is not None and b_array is not None and b_array.ndim == 2:  # b_array: b is an initializer
            if trans_b and alpha == 1.0:
                b = _stored_transposed(graph, b, b_array, transposed, names)
            elif trans_b or alpha != 1.0:
                w = b_array.T if trans_b else b_array
                b = add_initializer(
                    graph, names(f"{b.name}_gemm"), (w * np.asarray(alpha, dtype=w.dtype)).astype(w.dtype)
                )
            alpha = 1.0
        elif trans_b:
            node = ir.node("Transpose", [b], {"perm": [1, 0]}, name=f"{label}/TransposeB")
            new_nodes.append(node)
            b = node.outputs[0]

        matmul = ir.node("MatMul", [a, b], name=f"{label}/MatMul")
        new_nodes.append(matmul)
        result = matmul.outputs[0]
        if alpha != 1.0:
            assert b is not None  # Gemm's B is required (its dtype is read here)
            factor = add_initializer(graph, names(f"{label}/alpha"), np.asarray(alpha, dtype=_dtype_of(b, np.float32)))
            node = ir.node("Mul", [result, factor], name=f"{label}/MulAlpha")
            new_nodes.append(node)
            result = node.outputs[0]
        if c is not None and beta != 0.0:
            if beta != 1.0:
                c_array = const_array(c) if _is_initializer(graph, c) else None
                if c_array is not None:
                    c = add_initializer(
                        graph,
                        names(f"{c.name}_gemm"),
                        (c_array * np.asarray(beta, c_array.dtype)).astype(c_array.dtype),
                    )
                else:
                    factor = add_initializer(
                        graph, names(f"{label}/beta"), np.asarray(beta, dtype=_dtype_of(c, np.float32))
                    )
                    node = ir.node("Mul", [c, factor], name=f"{label}/MulBeta")
                    new_nodes.append(node)
                    c = node.outputs[0]
            node = ir.node("Add", [result, c], name=f"{label}/Add")
            new_nodes.append(node)
            result = node.outputs[0]
        ir.convenience.replace_nodes_and_values(graph, gemm, [gemm], new_nodes, [gemm.outputs[0]], [result])


def _is_initializer(graph: ir.Graph, value: ir.Value | None) -> bool:
    return value is not None and value.is_initializer() and value not in graph.inputs


def _dtype_of(value: ir.Value, default: npt.DTypeLike) -> np.dtype:
    return np.dtype(value.dtype.numpy()) if value.dtype is not None else np.dtype(default)


def _stored_transposed(
    graph: ir.Graph, b: ir.Value, array: np.ndarray, cache: dict[ir.Value, ir.Value], names: FreshNames
) -> ir.Value:
    """B stored as [K, N]: in place when only Gemms with transB=1 read it, else as a new initializer."""
    if b in cache:
        return cache[b]
    readers_agree = (
        all(
            user.op_type == "Gemm"
            and index == 1
            and user.attributes.get_int("transB", 0) == 1
            and user.attributes.get_float("alpha", 1.0) == 1.0
            for user, index in b.uses()
        )
        and b not in graph.outputs
    )
    if readers_agree:
        b.const_value = ir.Tensor(np.ascontiguousarray(array.T), name=b.name)
        b.shape = ir.Shape(array.T.shape)
        cache[b] = b
        return b
    cache[b] = add_initializer(graph, names(f"{b.name}_transposed"), np.ascontiguousarray(array.T))
    return cache[b]
