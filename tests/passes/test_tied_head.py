"""Finding the LM head and storing a tied embedding/head once (int8 per token), on real exports."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.core.errors import InputError
from onnxsmith.io.load import load_model
from onnxsmith.passes.gemm_to_matmul import GemmToMatMulPass
from onnxsmith.passes.tied_head import StoreHeadPass, find_lm_head
from onnxsmith.verify.compare import compare_models
from tests.support.check import save_ir
from tests.support.lm_models import float_tables_after_load, glassllm_folder, gpt2_folder, lm_gate_feeds


@pytest.mark.parametrize("which", ["gpt2", "glassllm"])
def test_tied_head_is_found_and_stored_once(tmp_path, which):
    source = (gpt2_folder() if which == "gpt2" else glassllm_folder()) / "onnx" / "model.onnx"
    model = load_model(source)
    GemmToMatMulPass()(model)
    head = find_lm_head(model)
    assert head.tied and len(head.lookups) == 1
    if which == "gpt2":  # optimum: the head reads Transpose(wte)
        assert "Transpose" in head.how and head.table.name == "transformer.wte.weight"
    else:  # TorchScript folded E.T into a second initializer equal to the table's transpose
        assert "constant" in head.how and head.table.name == "p.E"
    vocab, hidden = head.vocab, head.hidden
    fp32 = list(float_tables_after_load(source, vocab * hidden, tmp_path))
    assert len(fp32) == 2  # the source holds the table and its transposed copy

    store = StoreHeadPass(head, "int8")(model)
    after = save_ir(model, tmp_path / "after.onnx")
    stored = [
        v
        for v in model.graph.initializers.values()
        if v.const_value is not None and v.const_value.size == vocab * hidden
    ]
    assert [v.const_value.dtype.name for v in stored] == ["INT8"]
    assert stored[0].shape.dims == (hidden, vocab)  # the head's layout
    assert not any(n.op_type == "Gather" and n.inputs[0] is head.table for n in model.graph)
    assert list(float_tables_after_load(after, vocab * hidden, tmp_path)) == [
        head.weight.name
    ]  # one fp32 copy after the fold
    assert "tied embedding/LM head" in store.notes[0]

    comparison = compare_models(source, after, lm_gate_feeds(source), atol=1e9, rtol=0)
    logits = comparison.outputs[0]
    assert logits.name == "logits" and logits.cosine > 0.999 and logits.argmax_agreement >= 0.9


@pytest.mark.parametrize("which", ["gpt2", "glassllm"])
def test_tied_table_in_rows_keeps_row_lookups(tmp_path, which):
    """lookups="rows": stored once in the table's own layout; the lookups gather rows, the head reads a Transpose."""
    source = (gpt2_folder() if which == "gpt2" else glassllm_folder()) / "onnx" / "model.onnx"
    model = load_model(source)
    GemmToMatMulPass()(model)
    head = find_lm_head(model)
    store = StoreHeadPass(head, "int8", lookups="rows")(model)
    stored = [
        v
        for v in model.graph.initializers.values()
        if v.const_value is not None and v.const_value.size == head.vocab * head.hidden
    ]
    assert [(v.const_value.dtype.name, tuple(v.shape.dims)) for v in stored] == [("INT8", (head.vocab, head.hidden))]
    table = next(
        v for n in model.graph if n.op_type == "DequantizeLinear" for v in n.outputs if v.name == head.table.name
    )
    assert {(n.op_type, n.attributes.get_int("axis", 0)) for n, _ in table.uses()} == {("Gather", 0), ("Transpose", 0)}
    assert head.matmul.inputs[1].producer().op_type == "Transpose"
    assert "lookup(s) gather rows" in store.notes[0]
    after = save_ir(model, tmp_path / "after.onnx")
    comparison = compare_models(source, after, lm_gate_feeds(source), atol=1e9, rtol=0)
    assert comparison.outputs[0].cosine > 0.999 and comparison.outputs[0].argmax_agreement >= 0.9


def test_untied_head_and_table_each_stored_int8(tmp_path, save_proto):
    rng = np.random.default_rng(0)
    vocab, hidden = 50, 32
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    head_w = rng.standard_normal((hidden, vocab)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["wte", "input_ids"], ["h"], name="embed"),
            helper.make_node("Tanh", ["h"], ["t"]),
            helper.make_node("MatMul", ["t", "lm_head"], ["l0"], name="head"),
            helper.make_node("Add", ["l0", "bias"], ["logits"]),
        ],
        "untied",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", vocab])],
        [
            numpy_helper.from_array(table, "wte"),
            numpy_helper.from_array(head_w, "lm_head"),
            numpy_helper.from_array(np.zeros(vocab, np.float32), "bias"),
        ],
    )
    source = save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10))
    model = load_model(source)
    head = find_lm_head(model)
    assert not head.tied and head.table.name == "wte" and head.weight.name == "lm_head"
    StoreHeadPass(head, "int8")(model)
    dqs = {n.outputs[0].name: n for n in model.graph if n.op_type == "DequantizeLinear"}
    assert set(dqs) == {"wte", "lm_head"}
    assert dqs["wte"].attributes.get_int("axis") == 0 and dqs["lm_head"].attributes.get_int("axis") == 1
    after = save_ir(model, tmp_path / "after.onnx")
    feeds = [{"input_ids": rng.integers(0, vocab, (2, 5))}]
    comparison = compare_models(source, after, feeds, atol=1e9, rtol=0)
    assert comparison.outputs[0].cosine > 0.999


def test_head_that_cannot_be_found_is_a_clear_error(save_proto):
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["input_ids_f"], ["logits"])],
        "nohead",
        [helper.make_tensor_value_info("input_ids_f", TensorProto.FLOAT, ["b", "s", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 4])],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])))
    with pytest.raises(InputError, match="cannot find the LM head: output 'logits' is not computed by a MatMul"):
        find_lm_head(model)


def test_a_tied_table_on_q8_0_grids_is_stored_exactly_in_blocks(tmp_path):
    """GPT-2's tied table snapped to GGUF Q8_0 grids (blocks of 32 along hidden, ``d * q``): at opset 21 the int8
    head is stored in those symmetric blocks, and after onnxruntime folds it at load the head and the lookup read
    the source's own numbers (one scale per token would move them); below opset 21 it stays one scale per token."""
    import onnx_ir as ir
    from onnxscript.version_converter import ConvertVersionPass

    from onnxsmith.passes import quantization as qz
    from tests.support.lm_models import on_q8_0_grid

    model = load_model(gpt2_folder() / "onnx" / "model.onnx")
    GemmToMatMulPass()(model)
    table = find_lm_head(model).tied_table
    table.const_value = ir.tensor(on_q8_0_grid(table.const_value.numpy().T).T, name=table.name)
    opset17 = save_ir(model, tmp_path / "q8_0_opset17.onnx")
    ConvertVersionPass(qz.BLOCKED_DQ_OPSET, fallback=True)(model)
    model.ir_version = qz.BLOCKED_DQ_IR_VERSION
    source = save_ir(model, tmp_path / "q8_0.onnx")

    model = load_model(source)
    store = StoreHeadPass(find_lm_head(model), "int8")(model)
    assert "on its grid (exact" in store.rows[0]["stored as"] and store.rows[0]["rel. error"] < 1e-7
    after = save_ir(model, tmp_path / "after.onnx")
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")  # folded at load, as a web page loads it
    for feeds in lm_gate_feeds(source):
        want, got = (
            ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
            for path in (source, after)
        )
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    older = load_model(opset17)
    store = StoreHeadPass(find_lm_head(older), "int8")(older)
    assert store.rows[0]["stored as"] == "int8, one scale per token (tied head)"
    assert store.rows[0]["rel. error"] > 1e-3
