"""Where onnx.checker and onnxruntime disagree, onnxruntime decides (io/check.py, io/op_schemas.py).

onnxruntime's transformer optimizer writes LayerNormalization at default-domain opset 12 (onnx
has it from 17; onnxruntime registers it from 1). Such a model is loaded, transformed and judged,
and inspect says why it was accepted; an op neither knows is still refused, and the rest of a model
with a set-aside node is still checked.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import LEFT_TO_ONNXRUNTIME, load_model


def _layernorm_model(opset: int = 12, extra: list | None = None) -> onnx.ModelProto:
    """x[2, 16] -> MatMul(w) -> LayerNormalization(scale, bias) -> y (+ ``extra`` nodes)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w"),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(16)).astype(np.float32), "scale"),
        numpy_helper.from_array((0.1 * rng.standard_normal(16)).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node("LayerNormalization", ["h", "scale", "bias"], ["y"], axis=-1, epsilon=1e-5, name="ln"),
        *(extra or []),
    ]
    graph = helper.make_graph(
        nodes,
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, [2, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def test_an_op_onnxruntime_runs_is_accepted_and_said(tmp_path, cli):
    source = tmp_path / "ln12.onnx"
    onnx.save(_layernorm_model(), source)
    with pytest.raises(onnx.checker.ValidationError, match="LayerNormalization"):  # the disagreement
        onnx.checker.check_model(onnx.load(source), full_check=True)
    assert load_model(source).meta[LEFT_TO_ONNXRUNTIME] == [("", "LayerNormalization", 12)]
    inspected = cli("inspect", source)
    assert inspected.returncode == 0
    assert "onnx.checker has no LayerNormalization at opset 12" in " ".join(inspected.stdout.split())
    # transformed (the staged variant passes the same check) and judged by the gate
    made = cli("fp16", source, tmp_path / "half.onnx")
    assert made.returncode == 0, made.stderr
    assert cli("compare", source, tmp_path / "half.onnx").returncode == 0
    onnx.save(_layernorm_model(17), tmp_path / "ln17.onnx")
    assert LEFT_TO_ONNXRUNTIME not in load_model(tmp_path / "ln17.onnx").meta  # onnx has it at 17


def test_an_op_neither_knows_is_refused(tmp_path, cli):
    model = _layernorm_model(17)
    model.graph.node[1].op_type = "Frobnicate"
    onnx.save(model, tmp_path / "frob.onnx")
    result = cli("inspect", tmp_path / "frob.onnx")
    assert result.returncode == 2 and "No Op registered for Frobnicate" in result.stderr


def test_the_rest_of_the_model_is_still_checked(tmp_path, cli):
    """A set-aside LayerNormalization does not hide a broken node after it."""
    broken = helper.make_node("Add", ["y"], ["z"], name="add")  # Add needs two inputs
    onnx.save(_layernorm_model(12, [broken]), tmp_path / "broken.onnx")
    result = cli("inspect", tmp_path / "broken.onnx")
    assert result.returncode == 2 and "onnx.checker" in result.stderr and "add" in result.stderr
