"""runtime/inputs.py: the inputs a model is run on when the user gives none."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from onnxsmith.io.load import load_model
from onnxsmith.release.bench import BenchSettings, _write_inputs
from onnxsmith.runtime.inputs import input_specs, random_inputs


def _minus_one_batch(save_proto):
    """x: float[-1, 3, ?, ?] as PaddlePaddle's exporter writes a free batch (PP-OCR's classifier)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0, axes=[2, 3])],
        "minus_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, None, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])],
    )
    return save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_fixed_dim_of_minus_one_is_unknown(save_proto, cli, tmp_path):
    path = _minus_one_batch(save_proto)
    model = load_model(path)
    assert input_specs(model)[0].dims == (None, 3, None, None)
    assert random_inputs(model)["x"].shape[0] >= 1
    # --shape sizes it, as any unknown dim
    assert random_inputs(model, shapes={"x": (2, 3, 48, 192)})["x"].shape == (2, 3, 48, 192)
    result = cli("fp16", path, tmp_path / "fp16.onnx", "--shape", "x:2,3,48,192")
    assert result.returncode == 0, result.stderr
    # bench runs each batch at that batch
    files, note = _write_inputs(path, BenchSettings(batches=[1, 4]), tmp_path / "bench", None)
    assert note == ""
    assert [np.load(files[b])["x"].shape[0] for b in ("1", "4")] == [1, 4]
