"""`onnxsmith inspect` on built models and on real third-party ones."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis import summary as summary_module
from onnxsmith.analysis.summary import summarize
from onnxsmith.io.load import load_model
from tests.support.models import mlp, with_if_subgraph
from tests.support.realmodels import real_model


def _inspect(cli, path) -> dict:
    result = cli("inspect", path, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_counts_recurse_into_subgraphs(cli, save_proto):
    data = _inspect(cli, save_proto(with_if_subgraph()))
    assert data["ops"]["MatMul"] == 2  # one in each branch of the If
    assert data["subgraphs"] == 2
    assert data["parameters"] == 4 * 3 * 2 + 1


def test_io_dims_keep_symbolic_names(cli, save_proto):
    data = _inspect(cli, save_proto(mlp(batch="N")))
    assert data["inputs"] == [{"name": "x", "dtype": "FLOAT", "dims": ["N", 8]}]
    assert data["largest"][0]["name"] == "w1" and data["largest"][0]["readers"] == ["mm1"]


def test_weights_in_constant_nodes_are_counted(save_proto):
    w = numpy_helper.from_array(np.ones((3, 5), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["wc"], value=w), helper.make_node("MatMul", ["x", "wc"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
    )
    summary = summarize(load_model(save_proto(helper.make_model(graph))))
    assert summary.parameters == 15 and summary.largest[0].kind == "Constant node"


def test_warns_about_big_int64_and_bloat_chains_and_size(save_proto, monkeypatch):
    # Expand builds a big int64 index grid from constants: folding would store it.
    shape = numpy_helper.from_array(np.array([64, 1024, 1024], np.int64), "shape")
    row = numpy_helper.from_array(np.arange(1024, dtype=np.int64), "row")
    graph = helper.make_graph(
        [
            helper.make_node("Expand", ["row", "shape"], ["grid"], name="grid_expand"),
            helper.make_node("GatherElements", ["x", "grid"], ["y"], axis=2, name="gather"),
        ],
        "bloat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1024, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 1024, 1024])],
        [shape, row],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    from onnxsmith.irutil.types import infer_types

    infer_types(model)
    monkeypatch.setattr(summary_module, "INT64_WARN_BYTES", 4000)
    warnings = summarize(model).warnings
    assert any("grid_expand" in w and "512 MB" in w for w in warnings), warnings
    assert any("int64 tensor 'row'" in w and "read by grid_expand" in w for w in warnings), warnings
    monkeypatch.setattr(summary_module, "PROTOBUF_LIMIT", 9_000)
    assert any("within 10% of protobuf's 2 GiB" in w for w in summarize(model).warnings)


@pytest.mark.realmodel
def test_real_models(cli):
    ppocr = _inspect(cli, real_model("ppocr_rec"))
    assert ppocr["parameters"] > 2_600_000  # all of them in Constant nodes
    assert all(t["kind"] == "Constant node" for t in ppocr["largest"])
    silero = _inspect(cli, real_model("silero_vad"))
    assert silero["subgraphs"] > 0 and silero["ops"]["If"] >= 1
    # Nodes inside the If branches are counted: more than the main graph alone has.
    assert silero["node_count"] > len(onnx.load(real_model("silero_vad")).graph.node)
    minilm = _inspect(cli, real_model("minilm"))
    assert [i["dims"] for i in minilm["inputs"]] == [["batch_size", "sequence_length"]] * 2
    assert 17_000_000 < minilm["parameters"] < 17_500_000


@pytest.mark.realmodel
def test_compare_on_real_models(cli, tmp_path):
    minilm = real_model("minilm")
    assert cli("compare", minilm, minilm, "--shape", "sequence_length=12").returncode == 0
    silero = real_model("silero_vad")
    np.savez(
        tmp_path / "vad.npz",
        input=(0.1 * np.random.default_rng(0).standard_normal((1, 512))).astype(np.float32),
        state=np.zeros((2, 1, 128), np.float32),  # a stream's first window
        sr=np.array(16000, np.int64),
    )
    result = cli("compare", silero, silero, "--inputs", tmp_path / "vad.npz", "--json")
    assert result.returncode == 0, result.stderr
