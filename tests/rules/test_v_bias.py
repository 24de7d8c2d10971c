"""rules/v_bias.py: the value bias folded into the output projection's bias."""

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.rules.v_bias import v_bias_rules
from tests.support.fusion import FACEAGE, assert_same_outputs, assert_untouched, fusion_trace, prepared_mlp


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_value_bias_moves_into_output_bias(exporter, tmp_path):
    step = fusion_trace(str(FACEAGE[exporter]))["value bias into output bias"]
    assert step.outcome.matched == 4
    for node in step.model_after().graph:
        if node.op_type == "MultiHeadAttention":
            assert node.inputs[2].producer().op_type == "MatMul"  # v straight from its projection
    assert_same_outputs(step.before, step.after, tmp_path)


def test_leaves_a_graph_without_attention_untouched():
    assert_untouched(prepared_mlp(), "v bias", v_bias_rules)


def test_refuses_an_output_projection_that_is_not_a_constant():
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Add", ["v", "bv"], ["vb"]),
        helper.make_node("MultiHeadAttention", ["q", "k", "vb"], ["a"], domain="com.microsoft", num_heads=2),
        helper.make_node("MatMul", ["a", "wo"], ["o"]),
        helper.make_node("Add", ["o", "bo"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 8]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("wo", TensorProto.FLOAT, [8, 8]))
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8])],
        [numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), n) for n in ("bv", "bo")],
    )
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    outcome = assert_untouched(ir.serde.deserialize_model(proto), "v bias", v_bias_rules)
    assert "not a constant matrix" in outcome.reason
