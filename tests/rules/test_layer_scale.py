"""rules/layer_scale.py: (x @ W + b) * s -> x @ (W * s) + b * s."""

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.rules.layer_scale import layer_scale_rules
from tests.support.fusion import FACEAGE, assert_same_outputs, assert_untouched, fusion_trace, op_count, prepared_mlp


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_folds_both_layer_scales_of_every_block(exporter, tmp_path):
    step = fusion_trace(str(FACEAGE[exporter]))["layer scale into projections"]
    assert step.outcome.matched == 8  # attention output and MLP down projection, 4 blocks
    before, after = step.model_before(), step.model_after()
    assert op_count(after, "Mul") == op_count(before, "Mul") - 8
    assert not any("lambda1" in (v.name or "") for n in after.graph for v in n.inputs if v is not None)
    assert_same_outputs(step.before, step.after, tmp_path)


def test_leaves_a_graph_without_layer_scale_untouched():
    assert_untouched(prepared_mlp(), "layer scale", layer_scale_rules)


def test_refuses_a_scale_that_is_not_per_output_channel():
    """A per-token scale [4, 1] after a projection is not a layer scale; the rule says so."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("Add", ["y", "b"], ["z"]),
            helper.make_node("Mul", ["z", "s"], ["out"]),
        ],
        "per_token",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4, 8])],
        [
            numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
            numpy_helper.from_array(rng.standard_normal((4, 1)).astype(np.float32), "s"),
        ],
    )
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    outcome = assert_untouched(model, "layer scale", layer_scale_rules)
    assert "per output channel" in outcome.reason
