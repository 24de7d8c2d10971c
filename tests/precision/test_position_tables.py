"""A position table read at run-time positions (Sliced to the sequence length, Gathered at Range(seq)) is the
table's data, not arithmetic on sizes: fp16 stores it fp16 (khmersm's [1, 2048, 192] table stayed fp32 as 'shape
or index arithmetic', 22 % of its bytes)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.release.variant import produce_variant
from onnxsmith.transforms.fp16 import Options

VOCAB, POSITIONS, WIDTH = 50, 512, 64


def _encoder(read: str) -> onnx.ModelProto:
    """ids [1, S] -> token embedding + the first S rows of a position table (``read``: "slice" or "gather") ->
    a projection; the position table is most of the weights."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((VOCAB, WIDTH)) / 4).astype(np.float32), "tokens"),
        numpy_helper.from_array((rng.standard_normal((1, POSITIONS, WIDTH)) / 4).astype(np.float32), "pe"),
        numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32), "proj"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array(0, np.int64), "zero_scalar"),
        numpy_helper.from_array(np.array(1, np.int64), "one_scalar"),
    ]
    nodes = [
        helper.make_node("Gather", ["tokens", "ids"], ["embedded"], name="lookup"),
        helper.make_node("Shape", ["ids"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "one"], ["length"], name="length", axis=0),
    ]
    if read == "slice":
        nodes.append(helper.make_node("Slice", ["pe", "zero", "length", "one"], ["positions"], name="window"))
    else:
        nodes += [
            helper.make_node("Squeeze", ["length", "zero"], ["count"], name="count"),
            helper.make_node("Range", ["zero_scalar", "count", "one_scalar"], ["index"], name="index"),
            helper.make_node("Gather", ["pe", "index"], ["positions"], name="window", axis=1),
        ]
    nodes += [
        helper.make_node("Add", ["embedded", "positions"], ["summed"], name="add"),
        helper.make_node("MatMul", ["summed", "proj"], ["y"], name="proj"),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", WIDTH])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("read", ["slice", "gather"])
def test_a_position_table_read_at_run_time_positions_is_stored_fp16(tmp_path, read):
    source = tmp_path / "encoder.onnx"
    onnx.save(_encoder(read), source)
    feeds = [{"ids": np.random.default_rng(seed).integers(0, VOCAB, (1, 24)).astype(np.int64)} for seed in (1, 2)]
    out = tmp_path / "fp16.onnx"
    result = produce_variant(source, out, [("fp16", Options())], feeds=feeds)  # verified: outputs the source's
    assert result.comparison.passed
    stored = {name: value.dtype for name, value in load_model(out).graph.initializers.items()}
    assert {stored[name] for name in ("pe", "tokens", "proj")} == {ir.DataType.FLOAT16}
    assert out.stat().st_size < 0.55 * source.stat().st_size
    assert not any("shape or index arithmetic" in line for line in result.report.headline)
