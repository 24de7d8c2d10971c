"""GemmToMatMulPass: outputs unchanged, no Gemm left, every weight a plain [K, N] MatMul constant."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.passes.gemm_to_matmul import GemmToMatMulPass
from tests.support.check import assert_pass_preserves_outputs, save_ir
from tests.support.lm_models import gpt2_folder, lm_gate_feeds
from tests.support.models import mlp


def _gemm_model(*, trans_a=0, trans_b=0, alpha=1.0, beta=1.0, with_c=True, constant_b=True, shared_b=False):
    rng = np.random.default_rng(3)
    m, k, n = 3, 8, 5
    a_shape = [k, m] if trans_a else [m, k]
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
    inits = [numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "c")]
    if constant_b:
        inits.append(numpy_helper.from_array(b, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b.shape)))
    gemm_inputs = ["a", "b", "c"] if with_c else ["a", "b"]
    nodes = [
        helper.make_node(
            "Gemm", gemm_inputs, ["y"], name="gemm", alpha=alpha, beta=beta, transA=trans_a, transB=trans_b
        )
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])]
    if shared_b:  # a second Gemm reads the same weight the same way
        nodes.append(helper.make_node("Gemm", ["a", "b"], ["z"], name="gemm2", transA=trans_a, transB=trans_b))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [m, n]))
    graph = helper.make_graph(nodes, "gemm", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "case",
    [
        {},
        {"trans_b": 1},
        {"trans_a": 1},
        {"alpha": 0.5, "beta": 2.0},
        {"with_c": False},
        {"trans_b": 1, "constant_b": False},
        {"trans_b": 1, "alpha": 3.0},
        {"trans_b": 1, "shared_b": True},
        {"alpha": 0.5, "constant_b": False},
    ],
)
def test_every_gemm_form_becomes_matmul_with_the_same_outputs(tmp_path, save_proto, case):
    before = save_proto(_gemm_model(**case))
    model = load_model(before)
    result = GemmToMatMulPass()(model)
    assert result.modified
    ops = [n.op_type for n in model.graph]
    assert "Gemm" not in ops and "MatMul" in ops
    assert [o.name for o in model.graph.outputs] == [o.name for o in onnx.load(before).graph.output]
    if case.get("constant_b", True):
        for node in model.graph:
            if node.op_type == "MatMul":  # the weight is a [K, N] constant read directly
                w = node.inputs[1]
                assert w.const_value is not None and w.shape[0] == 8
    assert_pass_preserves_outputs(before, model, tmp_path)


def test_gpt2_export_body_becomes_plain_matmul_weights(tmp_path):
    before = gpt2_folder() / "onnx" / "model.onnx"
    model = load_model(before)
    gemms = sum(n.op_type == "Gemm" for n in model.graph)
    assert gemms == 8  # 2 blocks x (c_attn, c_proj, c_fc, mlp c_proj): optimum's Gemm body
    pass_ = GemmToMatMulPass()(model)
    assert pass_.rewritten == gemms
    weights = [n.inputs[1] for n in model.graph if n.op_type == "MatMul" and n.inputs[1].const_value is not None]
    assert len(weights) == gemms
    assert all(w.name.startswith("transformer.h.") for w in weights)  # the original names, no copies
    assert_pass_preserves_outputs(before, model, tmp_path, feeds=lm_gate_feeds(before))


def test_a_graph_without_gemm_is_unchanged(tmp_path, save_proto):
    path = save_proto(mlp())
    model = load_model(path)
    assert not GemmToMatMulPass()(model).modified
    assert (
        save_ir(model, tmp_path / "after.onnx").read_bytes()
        == save_ir(load_model(path), tmp_path / "again.onnx").read_bytes()
    )
