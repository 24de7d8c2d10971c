"""Residual rescaling on both exporters' face-age graphs: exact in fp32, ranges scaled by S, eps by S^2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.passes.residual_rescale import (
    ResidualRescalePass,
    choose_scale,
    find_residual_streams,
    rescale_residual,
)
from onnxsmith.probes.ranges import measure_ranges
from onnxsmith.runtime.inputs import random_inputs
from tests.support.check import assert_pass_preserves_outputs, save_ir
from tests.support.models import mlp

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
INFO = json.loads((FIXTURES / "faceage_info.json").read_text())


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_stream_found_and_rescaled_exactly(exporter, tmp_path):
    source = FIXTURES / f"faceage_{exporter}.onnx"
    model = load_model(source)
    (stream,) = find_residual_streams(model)
    assert stream.problem is None
    # The stream is exactly what the fixture calls the residual: every LayerNorm input but the neck's.
    ln_inputs = INFO["files"][source.name]["residual"]["ln_input_tensors"]
    assert stream.names == ln_inputs[:-1]
    assert len(stream.adds) == 8 and len(stream.norms) == 9
    eps = [n.attributes.get_float("epsilon") for n in stream.norms]

    scale = 1 / 32
    result = rescale_residual(model, stream, scale)
    assert result.norms == 9 and result.constants > 0
    assert [n.attributes.get_float("epsilon") for n in stream.norms] == pytest.approx([e * scale**2 for e in eps])
    after = save_ir(model, tmp_path / "rescaled.onnx")
    feeds = [random_inputs(model, seed=s) for s in range(2)]
    assert_pass_preserves_outputs(source, after, tmp_path, feeds=feeds, atol=1e-4, rtol=1e-4)

    if exporter == "torchscript":
        return  # the ranges below are the same check again; once is enough
    before = {r.name: r.absmax for r in measure_ranges(source, feeds[:1])}
    rescaled = {r.name: r.absmax for r in measure_ranges(after, feeds[:1])}
    for name in stream.names:  # the stream itself, 1.4e5 -> 4.4e3: fits fp16
        assert rescaled[name] == pytest.approx(before[name] * scale, rel=1e-5)
    assert max(rescaled[n] for n in result.scaled_names) < 65504 / 4
    untouched = [n for n in before if n not in set(result.scaled_names)]
    assert all(rescaled[n] == pytest.approx(before[n], rel=1e-3, abs=1e-3) for n in untouched)


def test_choose_scale():
    assert choose_scale(1.56e5, 65504 / 4) == 1 / 16
    assert choose_scale(1.56e5, 32768) == 1 / 8  # the hand fix's 1/8: half of fp16's range
    assert choose_scale(2.97e5, 65504 / 4) == 1 / 32
    assert choose_scale(1000.0, 65504 / 4) == 1.0


def test_no_stream_in_a_model_without_norms(save_proto):
    assert find_residual_streams(load_model(save_proto(mlp()))) == []


def _stream_model(stream_is_output: bool) -> onnx.ModelProto:
    """x -> Mul(w0) = s0 -> [LN -> MatMul -> Add to s] x2 -> LN -> y (and s2 as an output, if asked)."""
    rng = np.random.default_rng(0)
    d = 8
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["s0"])]
    inits = [numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32) * 1000, "w0")]
    for i in range(2):
        inits += [
            numpy_helper.from_array(np.ones(d, np.float32), f"g{i}"),
            numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32), f"w{i + 1}"),
        ]
        nodes += [
            helper.make_node("LayerNormalization", [f"s{i}", f"g{i}"], [f"n{i}"], epsilon=1e-5),
            helper.make_node("MatMul", [f"n{i}", f"w{i + 1}"], [f"b{i}"]),
            helper.make_node("Add", [f"s{i}", f"b{i}"], [f"s{i + 1}"]),
        ]
    inits.append(numpy_helper.from_array(np.ones(d, np.float32), "g2"))
    nodes.append(helper.make_node("LayerNormalization", ["s2", "g2"], ["y"], epsilon=1e-5))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, d])]
    if stream_is_output:
        outputs.append(helper.make_tensor_value_info("s2", TensorProto.FLOAT, [2, d]))
    graph = helper.make_graph(
        nodes, "stream", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, d])], outputs, inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_pass_on_a_small_stream_is_exact(save_proto, tmp_path):
    source = save_proto(_stream_model(stream_is_output=False))
    model = load_model(source)
    rescale = ResidualRescalePass(1 / 8)(model)
    assert rescale.modified
    assert len(rescale.streams) == 1 and rescale.results[0].constants == 3  # w0 and the two branch weights
    assert_pass_preserves_outputs(source, model, tmp_path, atol=1e-5, rtol=1e-5)


def test_stream_read_outside_norms_is_not_rescaled(save_proto):
    model = load_model(save_proto(_stream_model(stream_is_output=True)))
    (stream,) = find_residual_streams(model)
    assert "'s2' is a graph output" in stream.problem
    result = ResidualRescalePass(1 / 8)(model)
    assert not result.modified
    assert all(
        n.attributes.get_float("epsilon") == pytest.approx(1e-5)
        for n in model.graph
        if n.op_type == "LayerNormalization"
    )
