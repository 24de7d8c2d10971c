"""verify/runner.py: sessions on in-memory models feed their big weights as inputs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from onnxsmith.verify import runner
from onnxsmith.verify.inputs import random_inputs
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
    assert set(big) == set(session._onnxsmith_weights)
    feeds = random_inputs(model, dims={"batch": 3}, seed=1)
    in_memory = runner.run(session, feeds)
    from_file = runner.run(runner.open_session(path), feeds)
    for name, value in from_file.items():
        np.testing.assert_array_equal(in_memory[name], value)

    # The model is unchanged: same initializers in the same roles, same bytes when saved.
    assert {v.name: (v.is_initializer(), v.is_graph_input(), v.graph) for v in model.graph.initializers.values()} \
        == roles
    assert ir.serde.serialize_model(model).SerializeToString() == before
    save_model(model, tmp_path / "again.onnx")
    assert load_model(tmp_path / "again.onnx").graph.initializers.keys() == model.graph.initializers.keys()
