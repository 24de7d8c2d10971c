"""Identical constants stored once, initializers and Constant nodes alike; unique shapes never read."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from onnxsmith.irutil.walk import constant_tensors
from onnxsmith.passes import dedup_constants
from onnxsmith.passes.dedup_constants import DeduplicateConstantsPass
from tests.support.check import assert_pass_preserves_outputs
from tests.support.realmodels import real_model

# atol=0 asks for bit-identical outputs; compare's relative error then divides 0 by 0 where both are 0.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")


def _constant(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"const_{name}", value=numpy_helper.from_array(array))


def _repeated() -> onnx.ModelProto:
    """Four copies of one 8x8 table (two initializers, two Constant nodes), a same-shape different one."""
    table = np.arange(64, dtype=np.float32).reshape(8, 8)
    other = table + 1
    nodes = [
        _constant("c1", table),
        _constant("c2", table),
        _constant("c3", other),
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("MatMul", ["a", "w2"], ["b"]),
        helper.make_node("MatMul", ["b", "c1"], ["c"]),
        helper.make_node("MatMul", ["c", "c2"], ["d"]),
        helper.make_node("MatMul", ["d", "c3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "repeated",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(table, "w1"), numpy_helper.from_array(table, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_copies_merge_into_the_first(save_proto, tmp_path):
    source = save_proto(_repeated(), "repeated.onnx")
    model = load_model(source)
    dedup = DeduplicateConstantsPass()(model)
    assert dedup.modified
    assert sorted((d.name, d.kept) for d in dedup.removed) == [("const_c1", "w1"), ("const_c2", "w1"), ("w2", "w1")]
    assert list(model.graph.initializers) == ["w1"]
    assert [n.outputs[0].name for n in model.graph if n.op_type == "Constant"] == ["c3"]  # different: kept
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=1e-7)


def test_weights_with_a_unique_shape_are_never_read(save_proto, tmp_path, monkeypatch):
    proto = _repeated()
    proto.graph.initializer.append(numpy_helper.from_array(np.ones((300, 7), np.float32), "lonely"))
    proto.graph.node.append(helper.make_node("Identity", ["lonely"], ["lonely_out"]))
    proto.graph.output.append(helper.make_tensor_value_info("lonely_out", TensorProto.FLOAT, [300, 7]))
    model = load_model(save_proto(proto, "with_lonely.onnx"))
    save_model(model, tmp_path / "ext.onnx", external_data=True)  # weights become external tensors
    model = load_model(tmp_path / "ext.onnx")
    hashed = []
    real = dedup_constants._sha256
    monkeypatch.setattr(dedup_constants, "_sha256", lambda t: hashed.append(t.name) or real(t))
    DeduplicateConstantsPass()(model)
    assert "lonely" not in hashed and "w1" in hashed


@pytest.mark.realmodel
@pytest.mark.parametrize("name", ["ppocr_rec", "silero_vad"])
def test_real_models_keep_their_outputs(name, tmp_path):
    """PP-OCR keeps every weight in Constant nodes; silero VAD has constants inside If branches."""
    source = real_model(name)
    model = load_model(source)
    before = sum(1 for _ in constant_tensors(model))
    dedup = DeduplicateConstantsPass()(model)
    assert len(dedup.removed) > 10
    assert sum(1 for _ in constant_tensors(model)) == before - len(dedup.removed)
    rng = np.random.default_rng(0)
    feeds = [
        {"x": rng.standard_normal((1, 3, 48, 320)).astype(np.float32)}
        if name == "ppocr_rec"
        else {
            "input": rng.standard_normal((1, 512)).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64),
        }
    ]
    assert_pass_preserves_outputs(source, model, tmp_path, feeds=feeds, atol=0, rtol=1e-7)


def test_graph_outputs_are_not_merged(save_proto):
    table = numpy_helper.from_array(np.ones((4,), np.float32), "t1")
    graph = helper.make_graph(
        [_constant("t2", np.ones((4,), np.float32))],
        "outs",
        [],
        [
            helper.make_tensor_value_info("t1", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("t2", TensorProto.FLOAT, [4]),
        ],
        [table],
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert not DeduplicateConstantsPass()(model).modified
