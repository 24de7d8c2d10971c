"""The LM head as an 8-bit MatMulNBits whose rows the lookups gather, on real exports (passes/nbits_head.py)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnxsmith.io.load import load_model
from onnxsmith.passes import quantization as qz
from onnxsmith.passes.gemm_to_matmul import GemmToMatMulPass
from onnxsmith.passes.nbits_head import NBitsHeadPass
from onnxsmith.passes.tied_head import find_lm_head
from onnxsmith.verify.compare import compare_models
from tests.support.check import save_ir
from tests.support.lm_models import glassllm_folder, gpt2_folder, lm_gate_feeds, on_q8_0_grid


def _optimized_ops(path, tmp_path) -> list[str]:
    """The ops onnxruntime's CPU session runs after its own graph optimizations."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in ir.load(tmp_path / "optimized.onnx").graph]


@pytest.mark.parametrize("which", ["gpt2", "glassllm"])
def test_tied_head_runs_as_8bit_matmulnbits_and_lookups_gather_its_rows(tmp_path, which):
    source = (gpt2_folder() if which == "gpt2" else glassllm_folder()) / "onnx" / "model.onnx"
    model = load_model(source)
    GemmToMatMulPass()(model)
    head = find_lm_head(model)
    vocab, hidden, weight = head.vocab, head.hidden, head.weight_array
    lookup_output = head.lookups[0].outputs[0].name
    result = NBitsHeadPass(head)(model)
    assert "stored once" in result.notes[0] and result.rows[0]["rel. error"] < 0.01
    nbits = [n for n in model.graph if n.op_type == "MatMulNBits"]
    assert len(nbits) == 1 and nbits[0] is head.matmul
    attributes = {k: a.value for k, a in nbits[0].attributes.items()}
    assert attributes["bits"] == 8 and attributes["N"] == vocab and attributes["K"] == hidden
    assert attributes["accuracy_level"] == 4
    data = nbits[0].inputs[1]
    assert [reader.op_type for reader, _ in data.uses()] == ["MatMulNBits", "Gather"]  # one 8-bit copy
    floats = [
        v
        for v in model.graph.initializers.values()
        if v.const_value is not None and v.const_value.size >= vocab * hidden
    ]
    assert floats == [data]  # no fp32 table or head weight left
    # The lookup's output is exposed: it must be the 8-bit rows dequantized, exactly as the head reads them.
    model.graph.outputs.append(next(v for n in model.graph for v in n.outputs if v.name == lookup_output))
    after = save_ir(model, tmp_path / "after.onnx")
    assert "DequantizeLinear" not in _optimized_ops(after, tmp_path)  # nothing dequantized per call
    feeds = lm_gate_feeds(source)
    session = ort.InferenceSession(str(after), providers=["CPUExecutionProvider"])
    got = session.run([lookup_output], feeds[0])[0]
    table = qz.dequantize_blocked(qz.quantize_blocked(weight, 8, 32, False)).T  # [vocab, hidden]
    np.testing.assert_allclose(got, table[feeds[0]["input_ids"]], rtol=1e-6, atol=1e-7)
    # Before and after on the same inputs: the logits agree (int8 activations in the head).
    comparison = compare_models(source, after, feeds, atol=1e9, rtol=0)
    logits = next(o for o in comparison.outputs if o.name == "logits")
    assert logits.cosine > 0.999 and logits.argmax_agreement >= 0.9


def test_a_hidden_width_not_a_multiple_of_the_block_is_padded_and_unpadded(tmp_path):
    """gpt2's hidden 64 in blocks of 128: one padded block; the lookups slice the padding off."""
    source = gpt2_folder() / "onnx" / "model.onnx"
    model = load_model(source)
    GemmToMatMulPass()(model)
    head = find_lm_head(model)
    NBitsHeadPass(head, block_size=128, symmetric=True)(model)
    assert any(n.op_type == "Slice" and n.name.endswith("/unpadded") for n in model.graph)
    assert len(head.matmul.inputs) == 3  # symmetric: no zero points (MatMulNBits' offset 128)
    after = save_ir(model, tmp_path / "after.onnx")
    comparison = compare_models(source, after, lm_gate_feeds(source), atol=1e9, rtol=0)
    logits = next(o for o in comparison.outputs if o.name == "logits")
    assert logits.cosine > 0.999 and logits.argmax_agreement >= 0.9


def test_an_untied_table_is_gathered_int8_and_dequantized_by_rows(tmp_path):
    """A head with its own weight (GPT-2 untied here: the head reads 1.001 x the table's transpose): the head runs
    as MatMulNBits, the table is stored int8 per token and its lookup gathers rows before dequantizing them."""
    model = load_model(gpt2_folder() / "onnx" / "model.onnx")
    GemmToMatMulPass()(model)
    head = find_lm_head(model)
    own = ir.Value(
        name="lm_head.weight", shape=ir.Shape(head.weight_array.shape), type=ir.TensorType(ir.DataType.FLOAT)
    )
    own.const_value = ir.tensor(head.weight_array * np.float32(1.001), name="lm_head.weight")
    model.graph.register_initializer(own)
    head.matmul.replace_input_with(1, own)
    source = save_ir(model, tmp_path / "untied.onnx")
    model = load_model(source)
    head = find_lm_head(model)
    assert not head.tied and head.table is not None
    table = head.table.const_value.numpy()
    lookup_output = head.lookups[0].outputs[0].name
    result = NBitsHeadPass(head)(model)
    assert "(untied)" in result.notes[0] and "gather their rows" in result.notes[1]
    model.graph.outputs.append(next(v for n in model.graph for v in n.outputs if v.name == lookup_output))
    after = save_ir(model, tmp_path / "after.onnx")
    assert "DequantizeLinear" not in _optimized_ops(after, tmp_path)
    feeds = lm_gate_feeds(source)
    got = ort.InferenceSession(str(after), providers=["CPUExecutionProvider"]).run([lookup_output], feeds[0])[0]
    p = qz.quantize_per_channel_int8(table, axis=0)
    np.testing.assert_allclose(got, qz.dequantize_per_channel(p)[feeds[0]["input_ids"]], rtol=1e-6, atol=1e-7)
    comparison = compare_models(source, after, feeds, atol=1e9, rtol=0)
    logits = next(o for o in comparison.outputs if o.name == "logits")
    assert logits.cosine > 0.999 and logits.argmax_agreement >= 0.9


def test_a_table_on_q8_0_grids_is_stored_exactly(tmp_path):
    """GPT-2's tied table snapped to GGUF Q8_0 grids (each block of 32 along hidden ``d * q``): the head and the
    lookups restore it exactly (symmetric blocks) where the asymmetric ones would move it; the lookup's rows are
    the source's own."""
    model = load_model(gpt2_folder() / "onnx" / "model.onnx")
    GemmToMatMulPass()(model)
    table = find_lm_head(model).tied_table
    snapped = on_q8_0_grid(table.const_value.numpy().T).T  # [vocab, hidden], blocks along hidden
    table.const_value = ir.tensor(snapped, name=table.name)
    source = save_ir(model, tmp_path / "q8_0.onnx")
    assert qz.on_symmetric_grid(snapped.T, 8, 32) is not None
    assert qz.on_symmetric_grid(snapped.T * np.float32(1.01) + np.float32(1e-3), 8, 32) is None
    asymmetric = qz.quantize_blocked(snapped.T, 8, 32, False)
    assert qz.relative_error(snapped.T, qz.dequantize_blocked(asymmetric)) > 1e-3

    model = load_model(source)
    head = find_lm_head(model)
    lookup_output = head.lookups[0].outputs[0].name
    result = NBitsHeadPass(head)(model)
    row = result.rows[0]
    assert "on its grid (exact" in row["stored as"] and row["rel. error"] < 1e-7
    model.graph.outputs.append(next(v for n in model.graph for v in n.outputs if v.name == lookup_output))
    after = save_ir(model, tmp_path / "after.onnx")
    feeds = lm_gate_feeds(source)
    got = ort.InferenceSession(str(after), providers=["CPUExecutionProvider"]).run([lookup_output], feeds[0])[0]
    np.testing.assert_array_equal(got, snapped[feeds[0]["input_ids"]])
    comparison = compare_models(source, after, feeds, atol=1e9, rtol=0)
    logits = next(o for o in comparison.outputs if o.name == "logits")
    assert logits.cosine > 0.999 and logits.argmax_agreement >= 0.9
