"""QuantizeConvsPass: Conv [+ Relu] -> QDQ that onnxruntime runs as QLinearConv, run before and after."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.int8_engine.statistics import measure_ranges
from onnxsmith.io.load import load_model
from onnxsmith.passes import quantization as qz
from onnxsmith.passes.quantize_convs import ConvPlan, QuantizeConvsPass, find_convs, uint8_params
from onnxsmith.runtime import runner
from tests.support.check import save_ir


def _cnn(path, opset=17):
    """x -> c1+Relu -> c2+Relu, Add(skip) -> c3 and c4 (both read the sum) ; c3 -> depthwise dw."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = {"w1": w(8, 3, 3, 3), "b1": w(8) + 0.1, "w2": w(8, 8, 3, 3), "b2": w(8), "w3": w(8, 8, 1, 1)}
    inits |= {"w4": w(4, 8, 1, 1), "b4": w(4), "wd": w(8, 1, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["h2"], name="c2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
        helper.make_node("Add", ["r1", "r2"], ["a"], name="skip"),
        helper.make_node("Conv", ["a", "w3"], ["h3"], name="c3"),
        helper.make_node("Conv", ["a", "w4", "b4"], ["y2"], name="c4", strides=[2, 2]),
        helper.make_node("Conv", ["h3", "wd"], ["y"], name="dw", group=8, pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 16, 16])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, None),
        ],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def _feeds(seed, n=2):
    return {"x": np.random.default_rng(seed).uniform(-1, 1, (n, 3, 16, 16)).astype(np.float32)}


def _plans(model, path, names):
    convs = [c for c in find_convs(model) if c.name in names]
    ranges = measure_ranges(path, [_feeds(s) for s in range(3)], {v.name for c in convs for v in (c.input, c.output)})
    plans = {}
    for c in convs:
        x, y = ranges[c.input.name], ranges[c.output.name]
        plans[c.name] = ConvPlan(*uint8_params(x.low, x.high), *uint8_params(y.low, y.high))
    return plans


def _optimized_ops(path, tmp_path):
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)


def test_uint8_params_cover_the_range_with_an_exact_zero():
    scale, zero_point = uint8_params(-1.0, 3.0)
    assert scale == np.float32(4.0 / 255) and zero_point == 64
    assert uint8_params(0.0, 6.0) == (np.float32(6.0 / 255), 0)  # after a Relu: zero point 0
    assert uint8_params(0.0, 0.0) == (1.0, 0)


def test_finds_convs_and_their_relus(tmp_path):
    model = load_model(_cnn(tmp_path / "m.onnx"))
    found = {c.name: c for c in find_convs(model)}
    assert set(found) == {"c1", "c2", "c3", "c4", "dw"}
    assert found["c1"].output.name == "r1" and found["c3"].relu is None and found["dw"].group == 8


@pytest.mark.parametrize("opset", [17, 11])  # before 13: com.microsoft's per-channel DequantizeLinear
def test_outputs_match_and_onnxruntime_runs_qlinearconv(tmp_path, opset):
    source = _cnn(tmp_path / "m.onnx", opset)
    model = load_model(source)
    result = QuantizeConvsPass(_plans(model, source, {"c1", "c2", "c3", "c4"}))(model)
    assert result.quantized == ["c1", "c2", "c3", "c4"]
    ops = Counter(n.op_type for n in model.graph)
    # x, r1 (c1's output is c2's input: once), r2, the sum (read by c3 and c4: once), h3, y2
    assert ops["QuantizeLinear"] == 6 and ops["Conv"] == 5
    after = save_ir(model, tmp_path / "after.onnx")
    stored = {t.name: t.data_type for t in onnx.load(after).graph.initializer}
    assert not {"w1", "w2", "w3", "w4"} & set(stored) and stored["wd"] == TensorProto.FLOAT
    assert sum(t == TensorProto.INT8 for t in stored.values()) == 4
    assert sum(t == TensorProto.INT32 for t in stored.values()) == 3  # the biases
    # 7-bit weights: QLinearConv's uint8 x int8 kernel without VNNI saturates pairs of products at int16
    weights = [numpy_helper.to_array(t) for t in onnx.load(after).graph.initializer if t.data_type == TensorProto.INT8]
    assert max(int(np.abs(w.astype(int)).max()) for w in weights) == qz.CONV_INT8_LIMIT
    optimized = _optimized_ops(after, tmp_path)
    assert optimized["QLinearConv"] == 4 and optimized["Relu"] == 0  # the Relus drop out (zero point 0)
    feeds = _feeds(7, n=4)  # not the calibration inputs
    ref = runner.run(runner.open_session(source), feeds)
    out = runner.run(runner.open_session(after), feeds)
    for name in ("y", "y2"):
        assert 0 < np.linalg.norm(out[name] - ref[name]) / np.linalg.norm(ref[name]) < 0.05


def test_unplanned_convs_stay_and_a_lone_input_is_quantized_for_its_conv_only(tmp_path):
    source = _cnn(tmp_path / "m.onnx")
    model = load_model(source)
    QuantizeConvsPass(_plans(model, source, {"c2"}))(model)
    ops = Counter(n.op_type for n in model.graph)
    assert ops["QuantizeLinear"] == 2 and ops["Conv"] == 5 and ops["Relu"] == 2
    skip = next(n for n in model.graph if n.name == "skip")
    assert skip.inputs[0].name == "r1"  # the residual branch reads c1's fp32 output, c2 its quantized copy
    after = save_ir(model, tmp_path / "after.onnx")
    assert _optimized_ops(after, tmp_path)["QLinearConv"] == 1
    feeds = _feeds(8)
    ref, out = runner.run(runner.open_session(source), feeds), runner.run(runner.open_session(after), feeds)
    assert np.linalg.norm(out["y"] - ref["y"]) / np.linalg.norm(ref["y"]) < 0.03
