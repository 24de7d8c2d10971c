"""QuantizeTablesPass: Gather(table, ids) -> int8 rows restored per row, run in onnxruntime before and after."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.passes.quantize_tables import QuantizeTablesPass, find_tables
from onnxsmith.runtime import runner
from tests.support.check import save_ir

V, D = 1000, 32


def _embeddings_model(path, *, head_reads_table=False):
    """ids -> Gather(tokens) + Gather(positions) -> Add ; optionally a MatMul by the token table's transpose."""
    rng = np.random.default_rng(0)
    # rows of very different scales: one scale per row keeps each row's precision
    tokens = (rng.standard_normal((V, D)) * rng.uniform(0.01, 3.0, (V, 1))).astype(np.float32)
    positions = rng.standard_normal((64, D)).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Gather", ["tokens", "ids"], ["t"], name="lookup"),
        helper.make_node("Gather", ["positions", "pos"], ["p"], name="positions_lookup"),
        helper.make_node("Add", ["t", "p"], ["y"], name="add"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, D])]
    if head_reads_table:
        nodes += [
            helper.make_node("Transpose", ["tokens"], ["tokens_t"], name="t", perm=[1, 0]),
            helper.make_node("MatMul", ["y", "tokens_t"], ["logits"], name="head"),
        ]
        outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 16, V]))
    graph = helper.make_graph(
        nodes,
        "embeddings",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 16]),
            helper.make_tensor_value_info("pos", TensorProto.INT64, [16]),
        ],
        outputs,
        [numpy_helper.from_array(tokens, "tokens"), numpy_helper.from_array(positions, "positions")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, tokens


def _feeds():
    rng = np.random.default_rng(1)
    return {"ids": rng.integers(-V, V, (2, 16)).astype(np.int64), "pos": np.arange(16, dtype=np.int64)}


def test_finds_big_tables_read_only_by_gathers(tmp_path):
    path, _ = _embeddings_model(tmp_path / "m.onnx")
    assert [t.name for t in find_tables(load_model(path))] == ["tokens"]  # positions: 2,048 values, too small
    assert {t.name for t in find_tables(load_model(path), min_elements=0)} == {"tokens", "positions"}
    tied, _ = _embeddings_model(tmp_path / "tied.onnx", head_reads_table=True)
    assert find_tables(load_model(tied)) == []  # the head reads it too: its fp32 copy would stay


def test_outputs_match_in_onnxruntime_and_the_table_is_stored_int8(tmp_path):
    source, tokens = _embeddings_model(tmp_path / "m.onnx")
    model = load_model(source)
    result = QuantizeTablesPass({"tokens"})(model)
    assert result.quantized == ["tokens"]
    after = save_ir(model, tmp_path / "after.onnx")
    stored = {t.name: t for t in onnx.load(after).graph.initializer}
    assert "tokens" not in stored and stored["tokens_int8"].data_type == TensorProto.INT8
    assert after.stat().st_size < 0.35 * source.stat().st_size
    feeds = _feeds()  # negative ids too: both Gathers index the same row
    ref = runner.run(runner.open_session(source), feeds)["y"]
    out = runner.run(runner.open_session(after), feeds)["y"]
    # per row: every looked-up row within half a step of its own scale
    t_ref = tokens[feeds["ids"]]
    step = np.abs(t_ref).max(-1, keepdims=True) / 127
    assert np.all(np.abs(out - ref) <= step / 2 * (1 + 1e-4) + 1e-6)
    assert np.abs(out - ref).max() > 0


def test_unnamed_tables_stay(tmp_path):
    source, _ = _embeddings_model(tmp_path / "m.onnx")
    model = load_model(source)
    before = [n.op_type for n in model.graph]
    result = QuantizeTablesPass(set())(model)
    assert not result.modified and [n.op_type for n in model.graph] == before
