"""QuantizeLinearsPass: MatMul/Gemm (+bias) -> DynamicQuantizeLinear + MatMulIntegerToFloat, run in onnxruntime
before and after."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxscript.optimizer import basic_constant_propagation

from onnxsmith.io.load import load_model
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes import quantization as qz
from onnxsmith.passes.quantize_linears import (
    Int8Form,
    LinearPlan,
    QuantizeLinearsPass,
    find_linears,
    outlier_channels,
    rounding_key,
    smoothing_factors,
    smoothing_folds,
)
from onnxsmith.runtime import runner
from tests.support.check import save_ir

K, N = 64, 48


def _linears_model(path, *, shared=False):
    """x -> MatMul(W1)+b1 -> Relu -> Gemm(W2^T, b2, transB) ; a second MatMul reads W1 too when ``shared``."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((K, K)).astype(np.float32) * 0.1
    b1 = rng.standard_normal(K).astype(np.float32)
    w2t = rng.standard_normal((N, K)).astype(np.float32) * 0.1
    b2 = rng.standard_normal(N).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("Gemm", ["h2", "W2t", "b2"], ["y"], name="fc2", transB=1),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", N])]
    if shared:
        nodes.append(helper.make_node("MatMul", ["h2", "W1"], ["z"], name="fc3"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["rows", K]))
    graph = helper.make_graph(
        nodes,
        "linears",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
        outputs,
        [numpy_helper.from_array(a, n) for a, n in ((w1, "W1"), (b1, "b1"), (w2t, "W2t"), (b2, "b2"))],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _run(path, x):
    session = runner.open_session(path)
    return runner.run(session, {"x": x})


def test_finds_matmul_with_bias_and_gemm(tmp_path):
    model = load_model(_linears_model(tmp_path / "m.onnx"))
    found = {linear.name: linear for linear in find_linears(model)}
    assert set(found) == {"fc1", "fc2"}
    assert found["fc1"].bias_add is not None and found["fc1"].kn() == (K, K)
    assert found["fc2"].transposed and found["fc2"].kn() == (K, N) and found["fc2"].bias is not None


@pytest.mark.parametrize("smooth", [False, True])
def test_outputs_match_in_onnxruntime(tmp_path, smooth):
    source = _linears_model(tmp_path / "m.onnx")
    model = load_model(source)
    plans = {}
    for linear in find_linears(model):
        s = None
        if smooth:
            s = smoothing_factors(np.linspace(0.5, 20.0, K).astype(np.float32), [linear.weight_array()], 0.5)
        plans[linear.name] = LinearPlan(s)
    result = QuantizeLinearsPass(plans)(model)
    assert sorted(result.quantized) == ["fc1", "fc2"]
    ops = [n.op_type for n in model.graph]
    assert ops.count("MatMulIntegerToFloat") == 2 and ops.count("DynamicQuantizeLinear") == 2
    assert "MatMul" not in ops and "Gemm" not in ops and "Add" not in ops
    assert ops.count("Mul") == (2 if smooth else 0)
    after = save_ir(model, tmp_path / "after.onnx")
    x = np.random.default_rng(2).standard_normal((10, K)).astype(np.float32)
    ref, out = _run(source, x)["y"], _run(after, x)["y"]
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert 0 < rel < 0.03  # int8 error, not a different function
    # weights stay quantized in the file: int8 tensors (zero point 0), no fp32 copy of W1/W2t
    stored = {t.name: t.data_type for t in onnx.load(after).graph.initializer}
    assert "W1" not in stored and "W2t" not in stored
    assert sum(1 for t in stored.values() if t == TensorProto.INT8) == 4  # the weights and their zero points


def _avx2_product(xq: np.ndarray, wq: np.ndarray) -> np.ndarray:
    """``xq @ wq`` (uint8 by int8) as onnxruntime's kernel for x86 CPUs without VNNI computes it: vpmaddubsw adds
    each pair of products along K into int16 with saturation, then the pairs are summed in int32."""
    x, w = xq.astype(np.int64), wq.astype(np.int64)
    pairs = x[:, 0::2, None] * w[None, 0::2, :] + x[:, 1::2, None] * w[None, 1::2, :]
    return np.clip(pairs, -(2**15), 2**15 - 1).sum(axis=1)


@pytest.mark.parametrize("wide", [False, True], ids=["pairs", "wide"])
def test_int8_weights_compute_the_same_numbers_on_every_cpu(tmp_path, wide):
    """A full-range int8 weight saturates the int16 pair sums of the uint8 x int8 kernel that CPUs without VNNI run
    (emulated: this machine may have VNNI). By default each pair of a column's rows (k, k + 1) keeps
    |q_k| + |q_k+1| <= 128: 255 * 128 fits, and onnxruntime's output is the exact integer product, the one that
    kernel computes too, at about half a bit of the column's range. ``wide`` weights keep all 8 bits, stored uint8
    with zero point 128 (uint8 x uint8 widens first: exact too). Either way a variant verified on one CPU holds on
    every other."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((K, N)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", N])],
        [numpy_helper.from_array(w, "W")],
    )
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    model = load_model(source)
    QuantizeLinearsPass({"fc": LinearPlan(wide=wide)})(model)
    (node,) = [n for n in model.graph if n.op_type == "MatMulIntegerToFloat"]
    wq, w_scale, w_zero_point = (const_array(node.inputs[i]) for i in (1, 3, 5))
    full = qz.quantize_per_channel_int8(w, axis=1)
    worst = np.full((4, K), 255, np.uint8)
    assert not np.array_equal(_avx2_product(worst, full.q), worst.astype(np.int64) @ full.q.astype(np.int64))
    if wide:
        assert wq.dtype == np.uint8 and w_zero_point.dtype == np.uint8 and (w_zero_point == 128).all()
        q = wq.astype(np.int64) - 128
        np.testing.assert_array_equal(q, full.q)  # 8 bits, all of them
    else:
        assert wq.dtype == np.int8 and w_zero_point.dtype == np.int8 and (w_zero_point == 0).all()
        q = wq.astype(np.int64)
        assert 126 <= (np.abs(q[0::2]) + np.abs(q[1::2])).max() <= qz.PAIR_LIMIT  # the widest pair near the limit
        assert 1.2 < float(np.mean(w_scale / full.scale)) < 1.6  # the price: about half a bit
    # onnxruntime gives the exact product (and within pairs, so does the emulated kernel): x >= 0, so
    # DynamicQuantizeLinear's zero point is 0 and its scale max(x) / 255; then xq @ q * x_scale * w_scale
    after = save_ir(model, tmp_path / "after.onnx")
    x = np.abs(rng.standard_normal((10, K))).astype(np.float32)
    x[0, :] = x.max()  # a row of 255s: the worst case for the pair sums
    x_scale = np.float32(x.max()) / np.float32(255)
    xq = np.clip(np.rint(x / x_scale), 0, 255).astype(np.int64)
    if not wide:
        np.testing.assert_array_equal(_avx2_product(xq, wq), xq @ q)
    exact = (xq @ q) * (np.float64(x_scale) * w_scale.astype(np.float64))
    np.testing.assert_allclose(_run(after, x)["y"], exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


def test_shared_weight_is_quantized_once_and_a_shared_input_once(tmp_path):
    source = _linears_model(tmp_path / "m.onnx", shared=True)
    model = load_model(source)
    plans = {linear.name: LinearPlan() for linear in find_linears(model)}
    assert set(plans) == {"fc1", "fc2", "fc3"}
    QuantizeLinearsPass(plans)(model)
    ops = [n.op_type for n in model.graph]
    assert ops.count("DynamicQuantizeLinear") == 2  # x for fc1; h2 once for fc2 and fc3
    after = save_ir(model, tmp_path / "after.onnx")
    int8 = [t for t in onnx.load(after).graph.initializer if t.data_type == TensorProto.INT8 and len(t.dims) == 2]
    assert len(int8) == 2  # W1 once for fc1 and fc3, W2t once
    x = np.random.default_rng(3).standard_normal((6, K)).astype(np.float32)
    ref, out = _run(source, x), _run(after, x)
    for name in ("y", "z"):
        assert np.linalg.norm(out[name] - ref[name]) / np.linalg.norm(ref[name]) < 0.03


def test_unplanned_linears_stay_as_they_were(tmp_path):
    source = _linears_model(tmp_path / "m.onnx")
    model = load_model(source)
    QuantizeLinearsPass({"fc2": LinearPlan()})(model)
    ops = [n.op_type for n in model.graph]
    assert ops.count("MatMul") == 1 and ops.count("Add") == 1 and ops.count("MatMulIntegerToFloat") == 1
    x = np.random.default_rng(4).standard_normal((3, K)).astype(np.float32)
    after = save_ir(model, tmp_path / "after.onnx")
    assert np.linalg.norm(_run(after, x)["y"] - _run(source, x)["y"]) / np.linalg.norm(_run(source, x)["y"]) < 0.03


def test_a_bias_from_a_constant_node_after_the_matmul_stays_in_graph_order(tmp_path):
    """torch's exporters write ``MatMul; Constant (the bias); Add``: the int8 product reads that bias, so it must
    come after the Constant (a real CRNN's variant failed onnx.checker: not topologically sorted)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, N)).astype(np.float32) * 0.1
    b = rng.standard_normal(N).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["W"], name="weight", value=numpy_helper.from_array(w)),
        helper.make_node("MatMul", ["x", "W"], ["h"], name="fc"),
        helper.make_node("Constant", [], ["b"], name="bias", value=numpy_helper.from_array(b)),
        helper.make_node("Add", ["h", "b"], ["y"], name="fc_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "constant_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", N])],
    )
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    model = load_model(source)
    basic_constant_propagation(model.graph.all_nodes())  # as int8's rewrite rules leave Constant nodes' values
    assert QuantizeLinearsPass({"fc": LinearPlan()})(model).quantized == ["fc"]
    after = save_ir(model, tmp_path / "after.onnx")
    onnx.checker.check_model(onnx.load(after), full_check=True)
    x = rng.standard_normal((10, K)).astype(np.float32)
    ref, out = _run(source, x)["y"], _run(after, x)["y"]
    assert 0 < np.linalg.norm(out - ref) / np.linalg.norm(ref) < 0.03


def test_nothing_planned_changes_nothing(tmp_path):
    model = load_model(_linears_model(tmp_path / "m.onnx"))
    before = [n.op_type for n in model.graph]
    result = QuantizeLinearsPass({})(model)
    assert not result.modified and [n.op_type for n in model.graph] == before


def _layernorm_model(path, *, residual):
    """x -> LayerNormalization -> h ; q = h @ Wq, k = h @ Wk (and Shape(h)) ; y = q + k (+ h when ``residual``)."""
    rng = np.random.default_rng(5)
    inits = {
        "gamma": rng.uniform(0.5, 2.0, K).astype(np.float32),
        "beta": rng.standard_normal(K).astype(np.float32) * 0.1,
        "Wq": rng.standard_normal((K, K)).astype(np.float32) * 0.1,
        "Wk": rng.standard_normal((K, K)).astype(np.float32) * 0.1,
    }
    inits["gamma"][3] = 40.0  # an outlier channel: what smoothing is for
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln", axis=-1),
        helper.make_node("MatMul", ["h", "Wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["h", "Wk"], ["k"], name="k"),
        helper.make_node("Shape", ["h"], ["h_shape"], name="shape"),
        helper.make_node("Add", ["q", "k"], ["y"], name="sum"),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", K]),
        helper.make_tensor_value_info("h_shape", TensorProto.INT64, [2]),
    ]
    if residual:
        nodes.append(helper.make_node("Add", ["y", "h"], ["r"], name="residual"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["rows", K]))
    graph = helper.make_graph(
        nodes,
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("residual", [False, True])
def test_smoothing_folds_into_a_layernorm_nothing_else_reads(tmp_path, residual):
    source = _layernorm_model(tmp_path / "m.onnx", residual=residual)
    model = load_model(source)
    linears = find_linears(model)
    channel_max = np.abs(load_model(source).graph.initializers["gamma"].const_value.numpy()) * 3
    s = smoothing_factors(channel_max, [linear.weight_array() for linear in linears], 0.5)
    assert smoothing_folds(linears[0].input, [linear.node for linear in linears]) == (not residual)
    assert not smoothing_folds(linears[0].input, [linears[0].node])  # the other projection reads it unsmoothed
    QuantizeLinearsPass({linear.name: LinearPlan(s) for linear in linears})(model)
    ops = [n.op_type for n in model.graph]
    assert ops.count("DynamicQuantizeLinear") == 1 and ops.count("Mul") == (1 if residual else 0)
    ln = next(n for n in model.graph if n.op_type == "LayerNormalization")
    assert (ln.inputs[1].name == "gamma") == residual  # folded: a new, smoothed scale
    after = save_ir(model, tmp_path / "after.onnx")
    x = np.random.default_rng(6).standard_normal((12, K)).astype(np.float32)
    ref, out = _run(source, x), _run(after, x)
    assert np.array_equal(out["h_shape"], ref["h_shape"])
    for name in ("y", "r") if residual else ("y",):
        assert 0 < np.linalg.norm(out[name] - ref[name]) / np.linalg.norm(ref[name]) < 0.03


def test_smoothing_of_a_value_no_normalisation_made_costs_a_mul(tmp_path):
    model = load_model(_linears_model(tmp_path / "m.onnx"))
    fc1, fc2 = find_linears(model)
    assert not smoothing_folds(fc1.input, [fc1.node])  # a graph input
    assert not smoothing_folds(fc2.input, [fc2.node])  # a Relu's output


def test_outlier_channels_kept_out_of_the_int8_product(tmp_path):
    """A token-specific outlier (channel 5 at 60 on two rows, ~1 elsewhere: a BERT FFN unit on CLS/SEP) sets the
    per-tensor activation scale; kept out of the int8 product and added back in fp32, the error drops by far."""
    rng = np.random.default_rng(7)
    w, b = rng.standard_normal((K, N)).astype(np.float32) * 0.1, rng.standard_normal(N).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="fc"), helper.make_node("Add", ["h", "b"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", N])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    source = tmp_path / "linear.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    x = rng.standard_normal((16, K)).astype(np.float32)
    x[[0, 15], 5] = 60.0
    x[0, 9] = 25.0
    assert outlier_channels(np.abs(x).max(axis=0)) == (5, 9)
    assert outlier_channels(np.abs(rng.standard_normal((16, K))).max(axis=0)) == ()  # none: nothing to gain
    ref = _run(source, x)["y"]
    errors = {}
    for outliers in ((), (5, 9)):
        model = load_model(source)
        QuantizeLinearsPass({"fc": LinearPlan(outliers=outliers)})(model)
        ops = [n.op_type for n in model.graph]
        # apart: a Mul zeroes them before the quantization, Gather -> MatMul -> Add brings them back in fp32
        assert (ops.count("Mul"), ops.count("Gather"), ops.count("MatMul")) == ((1, 1, 1) if outliers else (0, 0, 0))
        int8_weight = next(v for v in model.graph.initializers.values() if v.name.startswith("W_int8"))
        assert (int8_weight.const_value.numpy()[list(outliers)] == 0).all()  # zeroed: they would widen the scales
        out = _run(save_ir(model, tmp_path / f"after{len(outliers)}.onnx"), x)["y"]
        errors[outliers] = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert errors[(5, 9)] < errors[()] / 3 and errors[(5, 9)] < 0.02, errors


def _correlated(rows, seed):
    """Inputs whose channels are strongly correlated (a few directions carry most of the energy)."""
    mixing = np.random.default_rng(99).standard_normal((K, K)) * np.geomspace(10.0, 0.1, K)[:, None]
    return (np.random.default_rng(seed).standard_normal((rows, K)) @ mixing).astype(np.float32)


def _rel_error(source, after, x):
    """RMS over rows of ||Δy|| / ||y||: a row far below the tensor's range counts as much as the largest."""
    ref, out = _run(source, x)["y"], _run(after, x)["y"]
    return float(np.sqrt(np.mean((np.linalg.norm(out - ref, axis=1) / np.linalg.norm(ref, axis=1)) ** 2)))


def test_two_pass_activations_cut_the_activation_rounding_error(tmp_path):
    source = _linears_model(tmp_path / "m.onnx")
    x = _correlated(64, seed=5) * np.geomspace(0.05, 5.0, 64, dtype=np.float32)[:, None]  # rows far apart in size
    errors = {}
    for two_pass in (False, True):
        model = load_model(source)
        QuantizeLinearsPass({n: LinearPlan() for n in ("fc1", "fc2")}, Int8Form(two_pass=two_pass))(model)
        ops = [n.op_type for n in model.graph]
        assert ops.count("MatMulIntegerToFloat") == (4 if two_pass else 2)
        assert ops.count("DynamicQuantizeLinear") == (4 if two_pass else 2)
        assert ops.count("DequantizeLinear") == ops.count("Sub") == ops.count("Add") == (2 if two_pass else 0)
        after = save_ir(model, tmp_path / f"two_pass_{two_pass}.onnx")
        int8 = [t for t in onnx.load(after).graph.initializer if t.data_type == TensorProto.INT8 and len(t.dims) == 2]
        assert len(int8) == 2  # one int8 weight per Linear, read by both passes
        errors[two_pass] = _rel_error(source, after, x)
    assert 0 < errors[True] < 0.5 * errors[False]


def test_error_compensated_weights_cut_the_error_on_inputs_like_the_calibration(tmp_path):
    """Weights rounded with the Gram matrices of calibration inputs (passes/quantization.py's GPTQ) give a
    smaller output error than rounding to nearest on other inputs of the same distribution; two-pass
    activations, so that the weights' rounding is what is left."""
    source = _linears_model(tmp_path / "m.onnx")
    model = load_model(source)
    linears = {linear.name: linear for linear in find_linears(model)}
    calibration = _correlated(2000, seed=6)
    hidden = np.maximum(calibration @ linears["fc1"].weight_array() + const_array(linears["fc1"].bias), 0)
    rounded = {}
    for name, x in (("fc1", calibration), ("fc2", hidden)):
        gram = x.astype(np.float64).T @ x
        rounded[rounding_key(name, LinearPlan())] = qz.quantize_columns_compensated(
            linears[name].weight_array(), qz.compensation_factor(gram)
        )
    x = _correlated(256, seed=7)  # not the calibration inputs
    errors = {}
    for label, form in (("nearest", Int8Form(two_pass=True)), ("compensated", Int8Form(rounded, two_pass=True))):
        model = load_model(source)
        QuantizeLinearsPass({"fc1": LinearPlan(), "fc2": LinearPlan()}, form)(model)
        errors[label] = _rel_error(source, save_ir(model, tmp_path / f"{label}.onnx"), x)
    assert 0 < errors["compensated"] < 0.7 * errors["nearest"]
