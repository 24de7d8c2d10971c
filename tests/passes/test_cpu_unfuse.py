"""CpuUnfusePass: SkipLayerNormalization / BiasGelu taken apart, Adds before a LayerNorm kept from onnxruntime's
load-time SkipLayerNormFusion; run in onnxruntime before and after, and the graph onnxruntime optimises checked."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.passes.cpu_unfuse import CpuUnfusePass
from tests.support.check import assert_pass_preserves_outputs, ops_onnxruntime_runs
from tests.support.fusion import op_count

B, S, D, F = 2, 8, 32, 64
SKIP_LN = {"domain": "com.microsoft", "epsilon": 1e-5}


def _save(path, nodes, inputs, outputs, arrays):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), n) for n, shape in arrays.items()]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, S, D]) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)
    return path


def _optimized_ops(path, tmp_path) -> list[str]:
    return ops_onnxruntime_runs(path, tmp_path / "ort-optimized.onnx")


def _encoder_block(path):
    """x -> MatMul + bias -> + x (residual) -> LayerNorm -> MatMul + bias -> Gelu: what onnxruntime fuses into
    SkipLayerNormalization and BiasGelu when it loads it."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Add", ["hb", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "g", "beta"], ["n"], axis=-1, epsilon=1e-12),
        helper.make_node("MatMul", ["n", "W2"], ["u"]),
        helper.make_node("Add", ["u", "b2"], ["ub"]),
        helper.make_node("Gelu", ["ub"], ["y"], domain="com.microsoft"),
    ]
    arrays = {"W1": (D, D), "b1": (D,), "g": (D,), "beta": (D,), "W2": (D, F), "b2": (F,)}
    return _save(path, nodes, ["x"], ["y"], arrays)


def test_add_before_layernorm_is_not_fused_by_onnxruntime(tmp_path):
    source = _encoder_block(tmp_path / "block.onnx")
    assert "SkipLayerNormalization" in _optimized_ops(source, tmp_path)  # what onnxruntime does to the source
    model = load_model(source)
    result = CpuUnfusePass()(model)
    assert result.sums == 1 and result.skip_layer_norms == result.bias_gelus == 0
    assert op_count(model, "Add") == 2  # the biases stay Adds: int8 folds them into their Linears
    assert_pass_preserves_outputs(source, model, tmp_path)  # writes the model it ran to after.onnx
    ops = _optimized_ops(tmp_path / "after.onnx", tmp_path)
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops and "Sum" in ops


def test_fused_ops_are_taken_apart(tmp_path):
    """SkipLayerNormalization with a bias and its sum output read, BiasGelu: same outputs, none left in the graph
    onnxruntime runs; the BiasGelu's bias becomes the Add after its MatMul (a Linear's bias)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("SkipLayerNormalization", ["h", "skip", "g", "beta", "b1"], ["n", "", "", "sum"], **SKIP_LN),
        helper.make_node("MatMul", ["n", "W2"], ["u"]),
        helper.make_node("BiasGelu", ["u", "b2"], ["y"], domain="com.microsoft"),
    ]
    arrays = {"W1": (D, D), "b1": (D,), "g": (D,), "beta": (D,), "W2": (D, F), "b2": (F,)}
    source = _save(tmp_path / "fused.onnx", nodes, ["x", "skip"], ["y", "sum"], arrays)
    model = load_model(source)
    result = CpuUnfusePass()(model)
    assert (result.skip_layer_norms, result.bias_gelus) == (1, 1)
    assert op_count(model, "SkipLayerNormalization") == op_count(model, "BiasGelu") == 0
    matmul = next(n for n in model.graph if n.op_type == "MatMul" and n.inputs[1].name == "W2")
    (user, _), *_ = matmul.outputs[0].uses()
    assert user.op_type == "Add" and user.inputs[1].name == "b2"
    assert_pass_preserves_outputs(source, model, tmp_path, atol=1e-4)
    ops = _optimized_ops(tmp_path / "after.onnx", tmp_path)
    assert "SkipLayerNormalization" not in ops and "BiasGelu" not in ops


def test_left_alone_where_a_statistic_is_read_or_the_add_is_a_bias(tmp_path):
    nodes = [
        helper.make_node("SkipLayerNormalization", ["x", "skip", "g", "beta"], ["n", "mean"], **SKIP_LN),
        helper.make_node("Add", ["n", "bias"], ["nb"]),
        helper.make_node("LayerNormalization", ["nb", "g", "beta"], ["y"], axis=-1),
    ]
    source = _save(
        tmp_path / "train.onnx", nodes, ["x", "skip"], ["y", "mean"], {"g": (D,), "beta": (D,), "bias": (D,)}
    )
    model = load_model(source)
    result = CpuUnfusePass()(model)
    assert not result.modified
    assert op_count(model, "SkipLayerNormalization") == 1 and op_count(model, "Add") == 1


def test_below_opset_8_an_add_stays_an_add(tmp_path):
    """Sum broadcasts only from opset 8 (onnxruntime still runs its contrib LayerNormalization below 17)."""
    nodes = [
        helper.make_node("Add", ["x", "r"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"], axis=-1),
    ]
    source = _save(tmp_path / "old.onnx", nodes, ["x", "r"], ["y"], {"g": (D,), "beta": (D,)})
    proto = onnx.load(source)
    proto.opset_import[0].version = 7
    onnx.save(proto, source)
    model = load_model(source)
    assert not CpuUnfusePass()(model).modified and op_count(model, "Add") == 1
    assert_pass_preserves_outputs(source, model, tmp_path)  # onnxruntime runs it as it was
