"""Small models built in code for unit tests (the exporter-made fixtures live in tests/fixtures)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp(hidden: int = 16, out: int = 4, seed: int = 0, opset: int = 17, batch="batch") -> onnx.ModelProto:
    """x[batch, 8] -> MatMul/Add/Relu -> MatMul/Add -> y[batch, out]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, hidden)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((hidden, out)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.standard_normal(out).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="mm1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="add1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["y0"], name="mm2"),
        helper.make_node("Add", ["y0", "b2"], ["y"], name="add2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def overflowing_fp16(scale: float = 1000.0) -> onnx.ModelProto:
    """An fp16 model whose intermediate overflows fp16 for |x| > 65.5 while its output stays finite in fp32.

    y = Softmax(Relu(x * scale) - 60000): for x = 100 the product is 1e5 (inf in fp16).
    """
    k = numpy_helper.from_array(np.array(scale, dtype=np.float16), "k")
    c = numpy_helper.from_array(np.array(60000.0, dtype=np.float16), "c")
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["a"], name="mul"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Sub", ["b", "c"], ["d"], name="sub"),
        helper.make_node("Softmax", ["d"], ["y"], name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4])],
        [k, c],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def with_if_subgraph() -> onnx.ModelProto:
    """y = If(sum(x) > 0) then x @ W1 else x @ W2 — weights inside the branches."""
    rng = np.random.default_rng(1)

    def branch(name, seed_w):
        w = numpy_helper.from_array(seed_w.astype(np.float32), f"{name}_w")
        node = helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_y"])
        return helper.make_graph(
            [node], name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)], [w]
        )

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"]),
        helper.make_node(
            "If",
            ["cond"],
            ["y"],
            then_branch=branch("then", rng.standard_normal((4, 3))),
            else_branch=branch("else", rng.standard_normal((4, 3))),
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "with_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
