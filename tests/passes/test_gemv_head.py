"""GemvHeadPass: the head's weight is [1, hidden, vocab] (not prepacked by onnxruntime); outputs unchanged."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.gemm_to_matmul import GemmToMatMulPass
from onnxsmith.passes.gemv_head import GemvHeadPass
from onnxsmith.passes.tied_head import StoreHeadPass, find_lm_head
from tests.support.check import save_ir
from tests.support.lm_models import assert_lm_pass_preserves_outputs, float_tables_after_load, lm_folder


def _stored(which: str, lookups: str):
    folder = lm_folder(which)
    source = folder / "onnx" / "model.onnx"
    model = load_model(source)
    GemmToMatMulPass()(model)
    infer_types(model)
    head = find_lm_head(model)
    StoreHeadPass(head, "int8", lookups=lookups)(model)
    return source, model, head


@pytest.mark.parametrize(
    "which, lookups", [("gpt2", "columns"), ("glassllm", "columns"), ("gpt2_nopast", "rows"), ("glassllm", "rows")]
)
def test_head_weight_gets_a_unit_dim_and_outputs_do_not_change(tmp_path, which, lookups):
    _source, model, head = _stored(which, lookups)
    quantized = save_ir(model, tmp_path / "stored.onnx")  # the int8 head: the reference from here on
    gemv = GemvHeadPass(head.matmul)(model)
    assert gemv.modified and not gemv.skipped
    weight = head.matmul.inputs[1]
    assert list(weight.shape) == [1, head.hidden, head.vocab]
    after = save_ir(model, tmp_path / "after.onnx")
    assert_lm_pass_preserves_outputs(quantized, after, tmp_path, atol=1e-5, rtol=1e-5)

    # what onnxruntime holds after folding the DequantizeLinear (and the Transpose of the rows layout)
    tables = float_tables_after_load(after, head.vocab * head.hidden, tmp_path)
    if lookups == "columns":  # one fp32 copy, 3-D: the lookups read it too
        assert list(tables.values()) == [[1, head.hidden, head.vocab]]
        assert "lookup(s) gather along the next axis" in gemv.how
    else:  # the table for the lookups and the head's 3-D transposed copy
        assert sorted(tables.values()) == [[1, head.hidden, head.vocab], [head.vocab, head.hidden]]
        assert "Unsqueeze(Transpose(" in gemv.how


def _head_read_also_by(reader: str, save_proto):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 20)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["h", "w"], ["logits"], name="head")]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 20])]
    if reader:
        nodes.append(helper.make_node(reader, ["w"], ["other"]))
        outputs.append(helper.make_tensor_value_info("other", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["b", "s", 8])],
        outputs,
        [numpy_helper.from_array(w, "w")],
    )
    return save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_weight_read_by_anything_else_is_left_alone(save_proto, tmp_path):
    model = load_model(_head_read_also_by("Relu", save_proto))
    infer_types(model)
    gemv = GemvHeadPass(find_lm_head(model).matmul)(model)
    assert not gemv.modified
    assert "also read by Relu" in gemv.skipped and list(model.graph.initializers["w"].shape) == [8, 20]

    source = _head_read_also_by("", save_proto)  # a plain constant head: stored 3-D in place
    model = load_model(source)
    infer_types(model)
    gemv = GemvHeadPass(find_lm_head(model).matmul)(model)
    assert gemv.modified and list(model.graph.initializers["w"].shape) == [1, 8, 20]
    feeds = {"h": np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)}
    before = ort.InferenceSession(str(source)).run(None, feeds)[0]
    after = ort.InferenceSession(str(save_ir(model, tmp_path / "after.onnx"))).run(None, feeds)[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
