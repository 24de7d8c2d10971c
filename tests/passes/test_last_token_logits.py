"""LastTokenLogitsPass: the logits become the source's last row; the KV cache is unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.core.errors import InputError
from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.last_token_logits import LastTokenLogitsPass
from onnxsmith.passes.tied_head import find_lm_head
from onnxsmith.runtime import runner
from tests.support.check import save_ir
from tests.support.lm_models import lm_folder, lm_gate_feeds


@pytest.mark.parametrize("which", ["gpt2", "gpt2_nopast", "glassllm"])
def test_logits_are_the_last_row_of_the_source(tmp_path, which):
    folder = lm_folder(which)
    source = folder / "onnx" / "model.onnx"
    model = load_model(source)
    infer_types(model)
    head = find_lm_head(model)
    LastTokenLogitsPass(head.matmul, head.logits)(model)
    assert [d if isinstance(d, int) else None for d in model.graph.outputs[0].shape][1:] == [1, head.vocab]
    after = save_ir(model, tmp_path / "after.onnx")
    feeds = lm_gate_feeds(source, count=2, length=12)[0]
    full = runner.run(runner.open_session(source), feeds)
    last = runner.run(runner.open_session(after), feeds)
    assert last["logits"].shape == (2, 1, head.vocab)
    np.testing.assert_allclose(last["logits"][:, 0], full["logits"][:, -1], rtol=1e-5, atol=1e-5)
    for name, value in full.items():
        if name != "logits":  # the cache is computed exactly as before
            np.testing.assert_array_equal(last[name], value)


def test_head_input_of_unknown_rank_is_refused(save_proto):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w"], ["logits"], name="head")],
        "flat",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["bs", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["bs", 10])],
        [numpy_helper.from_array(np.ones((8, 10), np.float32), "w")],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])))
    head = find_lm_head(model)
    with pytest.raises(InputError, match="has rank 2, not \\[batch, sequence, hidden\\]"):
        LastTokenLogitsPass(head.matmul, head.logits)(model)
