"""passes/raise_opset.py: a model raised to the opset a fusion needs computes what it computed."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from onnxsmith.io.load import load_model
from onnxsmith.passes.raise_opset import RaiseOpsetPass
from tests.support.check import assert_pass_preserves_outputs


def _squeeze_softmax(opset: int):
    """Ops whose form changed between 11 and 17: Squeeze's axes (an input from 13), Softmax's axis (13)."""
    nodes = [
        helper.make_node("Unsqueeze", ["x"], ["x4"], axes=[0]),
        helper.make_node("Softmax", ["x4"], ["s"], axis=2),
        helper.make_node("Squeeze", ["s"], ["y"], axes=[0]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_opset_11_becomes_17_and_computes_the_same(save_proto, tmp_path):
    source = save_proto(_squeeze_softmax(11))
    model = load_model(source)
    result = RaiseOpsetPass(17)(model)
    assert result.modified and result.before == 11 and model.opset_imports[""] == 17
    squeeze = next(node for node in model.graph if node.op_type == "Squeeze")
    assert len(squeeze.inputs) == 2  # axes as an input, as opset 13 has them
    feeds = [{"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}]
    assert_pass_preserves_outputs(source, model, tmp_path, feeds=feeds, atol=1e-6, rtol=1e-6)


def test_a_model_at_or_above_the_opset_is_left_alone(save_proto):
    model = load_model(save_proto(_squeeze_softmax(11)))
    for version in (11, 9):  # never lowered
        assert not RaiseOpsetPass(version)(model).modified and model.opset_imports[""] == 11
