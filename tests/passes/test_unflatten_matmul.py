"""UnflattenMatMulPass: the Reshape pair around optimum's linear layers goes; outputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.gemm_to_matmul import GemmToMatMulPass
from onnxsmith.passes.unflatten_matmul import UnflattenMatMulPass
from tests.support.check import assert_pass_preserves_outputs, save_ir
from tests.support.lm_models import assert_lm_pass_preserves_outputs, glassllm_folder, gpt2_folder


def _ops(model) -> list[str]:
    return [n.op_type for n in model.graph if n.op_type != "Constant"]


@pytest.mark.parametrize("past", [True, False])
def test_gpt2_linear_layers_lose_their_reshapes(tmp_path, past):
    source = gpt2_folder(past) / "onnx" / "model.onnx"
    model = load_model(source)
    GemmToMatMulPass()(model)
    infer_types(model)
    before = _ops(model)
    unflatten = UnflattenMatMulPass()(model)
    RemoveUnusedNodesPass()(model)
    after = _ops(model)
    assert unflatten.rewritten == 8  # 2 layers x (c_attn, attn c_proj, c_fc, mlp c_proj)
    assert before.count("Reshape") - after.count("Reshape") == 16
    assert len(before) - len(after) >= 8 * 11  # each layer: 13 nodes -> MatMul + Add
    for node in model.graph:  # no linear layer reads a flattened [rows, K] input any more
        if node.op_type == "MatMul" and node.inputs[1].name.endswith(".weight"):
            producer = node.inputs[0].producer()
            assert (
                producer.op_type != "Reshape" or len(producer.inputs[1].shape) != 1 or producer.inputs[1].shape[0] != 2
            )
    assert_lm_pass_preserves_outputs(source, model, tmp_path)


def test_glassllm_has_no_such_pair_and_is_unchanged(tmp_path):
    model = load_model(glassllm_folder() / "onnx" / "model.onnx")
    infer_types(model)
    before = _ops(model)
    unflatten = UnflattenMatMulPass()(model)
    assert not unflatten.modified and unflatten.rewritten == 0
    assert _ops(model) == before


def _wrapped(restore: list[int], *, bias_shape=(6,), extra_reader=False):
    """x [2, 3, 4] -> Reshape [-1, 4] -> MatMul W [4, 6] -> Add bias -> Reshape ``restore``."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Reshape", ["x", "flat"], ["x2"]),
        helper.make_node("MatMul", ["x2", "w"], ["y2"]),
        helper.make_node("Add", ["y2", "b"], ["z2"]),
        helper.make_node("Reshape", ["z2", "back"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:  # something else reads the 2-D product
        nodes.append(helper.make_node("Relu", ["y2"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "wrapped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        outputs,
        [
            numpy_helper.from_array(np.array([-1, 4], np.int64), "flat"),
            numpy_helper.from_array(np.array(restore, np.int64), "back"),
            numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(bias_shape).astype(np.float32), "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "case",
    [
        {"restore": [2, 3, 6]},
        {"restore": [0, 3, 6]},  # 0 would copy the 2-D product's dim 0 (6 rows): a different Reshape
        {"restore": [3, 2, 6]},  # the leading dims are not x's
        {"restore": [2, 3, 6], "bias_shape": (6, 6)},  # a bias with rows broadcasts differently on 3-D
        {"restore": [2, 3, 6], "extra_reader": True},
    ],
)
def test_only_a_provably_equivalent_pair_is_removed(tmp_path, save_proto, case):
    source = save_proto(_wrapped(**case))
    model = load_model(source)
    infer_types(model)
    unflatten = UnflattenMatMulPass()(model)
    removable = case == {"restore": [2, 3, 6]}
    assert unflatten.rewritten == (1 if removable else 0)
    assert _ops(model).count("Reshape") == (0 if removable else 2)
    if removable:
        feeds = [{"x": np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)}]
        assert_pass_preserves_outputs(source, save_ir(model, tmp_path / "after.onnx"), tmp_path, feeds=feeds)
