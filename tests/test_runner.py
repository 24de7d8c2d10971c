"""runtime/runner.py: sessions on in-memory models feed their big weights as inputs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from onnxsmith.runtime import runner
from onnxsmith.runtime.inputs import random_inputs
from tests.support.models import mlp


def test_an_in_memory_model_runs_like_its_file_and_is_left_as_it_was(tmp_path):
    path = tmp_path / "mlp.onnx"
    path.write_bytes(mlp(hidden=256, out=128).SerializeToString())  # a 256x128 fp32 weight: 128 KiB
    model = load_model(path)
    big = [v.name for v in model.graph.initializers.values() if v.const_value.nbytes >= runner.FED_BYTES]
    assert big, "the test needs a weight that is fed as an input"
    before = ir.serde.serialize_model(model).SerializeToString()
    roles = {v.name: (v.is_initializer(), v.is_graph_input(), v.graph) for v in model.graph.initializers.values()}

    session = runner.open_session(model)
    # The big weights are inputs of the session, fed by runner.run with the weights' own arrays.
    assert set(big) <= {i.name for i in session.get_inputs()}
    assert set(big) == set(session.weights)
    feeds = random_inputs(model, dims={"batch": 3}, seed=1)
    in_memory = runner.run(session, feeds)
    from_file = runner.run(runner.open_session(path), feeds)
    for name, value in from_file.items():
        np.testing.assert_array_equal(in_memory[name], value)

    # The model is unchanged: same initializers in the same roles, same bytes when saved.
    assert {
        v.name: (v.is_initializer(), v.is_graph_input(), v.graph) for v in model.graph.initializers.values()
    } == roles
    assert ir.serde.serialize_model(model).SerializeToString() == before
    save_model(model, tmp_path / "again.onnx")
    assert load_model(tmp_path / "again.onnx").graph.initializers.keys() == model.graph.initializers.keys()


def test_an_in_memory_model_with_small_external_weights_runs(tmp_path):
    """Weights of any size may live in a data file: none may reach onnxruntime as a file path."""
    import onnx

    proto = mlp(hidden=16, out=4)
    onnx.save(
        proto,
        tmp_path / "ext.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.onnx.data",
        size_threshold=0,
    )
    model = load_model(tmp_path / "ext.onnx")
    assert all(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values())
    assert all(v.const_value.nbytes < runner.FED_BYTES for v in model.graph.initializers.values())
    feeds = random_inputs(model, dims={"batch": 2}, seed=3)
    in_memory = runner.run(runner.open_session(model), feeds)
    from_file = runner.run(runner.open_session(tmp_path / "ext.onnx"), feeds)
    for name, value in from_file.items():
        np.testing.assert_array_equal(in_memory[name], value)
    assert all(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values())
