"""Weight quantization: the numbers (passes/quantization.py) and QuantizeWeightsPass in onnxruntime."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxscript.version_converter import ConvertVersionPass

from onnxsmith.io.load import load_model
from onnxsmith.passes import quantization as qz
from onnxsmith.passes.quantize_weights import QuantizeWeightsPass
from onnxsmith.passes.tied_head import find_lm_head
from onnxsmith.runtime import runner
from tests.support.check import ops_onnxruntime_runs, save_ir
from tests.support.lm_models import gpt2_on_gguf_grids, lm_gate_feeds, on_q4_1_grid

FOLD = {"session.disable_quant_qdq": "1"}
CONFIGS = [(4, False), (4, True), (8, False), (8, True)]


def _weight(k=96, n=40, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32) * 0.05
    w[:, 3] += 0.2  # a column of one sign: its blocks' range must still include 0
    return w


@pytest.mark.parametrize("bits,symmetric", CONFIGS)
def test_blocked_quantization_error_is_at_most_half_a_step(bits, symmetric):
    w = _weight()
    b = qz.quantize_blocked(w, bits, 32, symmetric)
    assert b.q.shape == w.shape and b.scale.shape == (3, 40)
    restored = qz.dequantize_blocked(b)
    step = np.repeat(b.scale, 32, axis=0)
    assert np.all(np.abs(restored - w) <= step / 2 * (1 + 1e-5) + 1e-9)
    levels = b.q.astype(np.int32)
    if symmetric:
        assert b.zero_point is None and levels.min() >= -(2 ** (bits - 1)) + 1 and levels.max() <= 2 ** (bits - 1) - 1
    else:
        assert levels.min() >= 0 and levels.max() <= 2**bits - 1
        # zero is exact: where w is 0, q equals the zero point
        z = np.zeros_like(w)
        assert np.all(qz.dequantize_blocked(qz.quantize_blocked(z, bits, 32, symmetric)) == 0)


def test_short_last_block_and_zero_blocks():
    w = _weight(k=70)
    w[:32, 0] = 0.0
    b = qz.quantize_blocked(w, 4, 32, False)
    assert b.scale.shape == (3, 40)
    assert np.isfinite(qz.dequantize_blocked(b)).all()
    assert np.all(qz.dequantize_blocked(b)[:32, 0] == 0)
    assert qz.relative_error(w, qz.dequantize_blocked(b)) < 0.12


def test_per_channel_int8():
    w = _weight()
    p = qz.quantize_per_channel_int8(w.T, axis=0)  # one scale per row of [vocab, hidden]
    assert p.q.dtype == np.int8 and p.scale.shape == (40,)
    assert np.all(np.abs(qz.dequantize_per_channel(p) - w.T) <= p.scale[:, None] / 2 * (1 + 1e-5))
    assert qz.relative_error(w.T, qz.dequantize_per_channel(p)) < 0.01


@pytest.mark.parametrize("slab", [1, 5, 1 << 22])
def test_per_channel_int8_in_slabs_gives_the_whole_weights_numbers(monkeypatch, slab):
    """Quantized a slab of rows at a time (a 2 GB table is never widened to float64 whole): the same bytes as the
    formula on the whole weight, along any axis, a zero channel included."""

    def whole(w, axis):
        others = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
        scale = (np.abs(w.astype(np.float64)).max(axis=others) / 127.0).astype(w.dtype)
        shape = [1] * w.ndim
        shape[axis] = -1
        safe = np.where(scale == 0, 1, scale).astype(np.float64).reshape(shape)
        return np.clip(np.rint(w / safe), -127, 127).astype(np.int8), scale

    monkeypatch.setattr(qz, "_SLAB_ELEMENTS", slab)
    rng = np.random.default_rng(0)
    for shape in [(13, 7), (1, 9), (4, 5, 6), (40,)]:
        w = (rng.standard_normal(shape) * rng.uniform(0.01, 10.0, shape[-1:])).astype(np.float32)
        w[0] = 0
        for axis in range(-w.ndim, w.ndim):
            p = qz.quantize_per_channel_int8(w, axis)
            q, scale = whole(w, axis)
            assert p.axis == axis % w.ndim
            assert p.q.tobytes() == q.tobytes() and p.q.shape == q.shape
            assert p.scale.tobytes() == scale.tobytes() and p.scale.dtype == np.float32


def _matmul_model(k: int, n: int = 64, seed: int = 0) -> onnx.ModelProto:
    """x [b, s, k] @ w [k, n] -> Relu -> @ w2 [n, 48]."""
    w = _weight(k, n, seed)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 48])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(_weight(n, 48, seed + 1), "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _outputs(path, feeds, config=None):
    session = runner.open_session(path, options=runner.session_options(config=config))
    return runner.run(session, feeds)


def _run(path, x, config=None):
    return _outputs(path, {"x": x}, config)["y"]


def _expected(model: onnx.ModelProto, x: np.ndarray, bits: int, symmetric: bool) -> np.ndarray:
    """x @ W1q -> Relu -> @ W2q, with the weights as the numbers module restores them."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    deq = [qz.dequantize_blocked(qz.quantize_blocked(inits[n], bits, 32, symmetric)) for n in ("w", "w2")]
    return np.maximum(x @ deq[0], 0) @ deq[1]


@pytest.mark.parametrize("bits,symmetric", CONFIGS)
@pytest.mark.parametrize("fmt", ["qdq", "nbits"])
def test_pass_runs_in_onnxruntime_as_the_numbers_say(tmp_path, save_proto, bits, symmetric, fmt):
    proto = _matmul_model(96)
    before = save_proto(proto)
    model = load_model(before)
    pass_ = QuantizeWeightsPass(bits=bits, block_size=32, symmetric=symmetric, format=fmt, accuracy_level=0)(model)
    assert pass_.modified and pass_.quantized == 2
    ops = [n.op_type for n in model.graph]
    if fmt == "qdq":
        assert ops.count("DequantizeLinear") == 2 and "MatMulNBits" not in ops
        dq = [n for n in model.graph if n.op_type == "DequantizeLinear"]
        assert {n.outputs[0].name for n in dq} == {"w", "w2"}  # restored under the original names
        assert all(n.attributes.get_int("block_size") == 32 for n in dq)
        expected_type = {
            (4, False): ir_type("UINT4"),
            (4, True): ir_type("INT4"),
            (8, False): ir_type("UINT8"),
            (8, True): ir_type("INT8"),
        }[bits, symmetric]
        assert all(n.inputs[0].const_value.dtype == expected_type for n in dq)
        assert "w" not in model.graph.initializers and "w2" not in model.graph.initializers
    else:
        assert ops.count("MatMulNBits") == 2 and "MatMul" not in ops
    after = save_ir(model, tmp_path / "after.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 96)).astype(np.float32)
    want = _expected(proto, x, bits, symmetric)
    configs = (
        [{"session.disable_quant_qdq": "1"}, {"session.qdq_matmulnbits_accuracy_level": "0"}]
        if fmt == "qdq"
        else [None]
    )
    for config in configs:
        got = _run(after, x, config)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # and it is close to the fp32 model (4-bit: a few percent of the output's scale)
    ref = _run(before, x)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < (0.15 if bits == 4 else 0.01)


def ir_type(name):

    return getattr(ir.DataType, name)


@pytest.mark.parametrize("uneven", ["int8", "keep"])
def test_k_not_a_multiple_of_the_block_is_said_and_not_block_quantized(tmp_path, save_proto, uneven):
    before = save_proto(_matmul_model(70))
    model = load_model(before)
    pass_ = QuantizeWeightsPass(uneven=uneven)(model)
    assert any("K is not a multiple of the block size 32" in note and "w (K=70)" in note for note in pass_.notes)
    row = next(r for r in pass_.rows if r["weight"] == "w")
    if uneven == "keep":
        assert "w" in model.graph.initializers and row["stored as"].startswith("unchanged")
    else:
        dq = next(n for n in model.graph if n.op_type == "DequantizeLinear" and n.outputs[0].name == "w")
        assert dq.inputs[0].const_value.dtype == ir_type("INT8") and "block_size" not in dq.attributes
        assert dq.attributes.get_int("axis") == 1
    after = save_ir(model, tmp_path / "after.onnx")
    x = np.random.default_rng(2).standard_normal((1, 4, 70)).astype(np.float32)
    ref = _run(before, x)
    got = _run(after, x, {"session.disable_quant_qdq": "1"})
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.15


def test_a_graph_without_constant_matmul_weights_is_unchanged(save_proto):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "dyn",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [32, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])))
    pass_ = QuantizeWeightsPass()(model)
    assert not pass_.modified and pass_.quantized == 0


def test_error_compensated_rounding_weighs_errors_by_the_inputs():
    """GPTQ rounding of passes/quantization.py: the scales of rounding to nearest, int8 within ±127 and every pair of
    rows within PAIR_LIMIT, and a smaller ||X (w - w_int8)|| on inputs X like the calibration's; an input channel
    never seen is rounded to nearest."""
    rng = np.random.default_rng(0)
    k, n = 64, 32
    mixing = rng.standard_normal((k, k)) * np.geomspace(10.0, 0.1, k)[:, None]
    calibration = rng.standard_normal((1000, k)) @ mixing
    calibration[:, 5] = 0.0  # a channel the calibration never saw
    w = rng.standard_normal((k, n)).astype(np.float32) * 0.05
    plain = qz.quantize_linear_int8(w)
    compensated = qz.quantize_columns_compensated(w, qz.compensation_factor(calibration.T @ calibration))
    assert compensated.q.dtype == np.int8 and compensated.q.shape == w.shape and compensated.axis == 1
    np.testing.assert_array_equal(compensated.scale, plain.scale)
    q = compensated.q.astype(int)
    assert np.abs(q).max() <= 127 and (np.abs(q[0::2]) + np.abs(q[1::2])).max() <= qz.PAIR_LIMIT
    np.testing.assert_array_equal(compensated.q[5], plain.q[5])
    x = rng.standard_normal((500, k)) @ mixing
    x[:, 5] = 0.0

    def error(p):
        return np.linalg.norm(x @ (w - qz.dequantize_per_channel(p))) / np.linalg.norm(x @ w)

    assert 0 < error(compensated) < 0.7 * error(plain)


def test_compensated_rounding_keeps_each_pair_within_its_room():
    """Row 0's rounding error, compensated into row 1 ten-fold, asks row 1 for more than its pair leaves: it is cut
    back to the room (then its own error is compensated onward), and the pair stays within PAIR_LIMIT."""
    scale = 1.0 / 127
    w = np.array([[63.7 * scale], [63.3 * scale]], np.float32)  # the widest pair: its sum maps to 127
    factor = np.array([[1.0, 10.0], [0.0, 1.0]])
    q = qz.quantize_columns_compensated(w, factor).q.astype(int)[:, 0]
    wanted = round(63.3 - 10 * (63.7 - 64))  # row 1 after row 0's error (-0.3 steps) compensated: 66
    assert wanted > qz.PAIR_LIMIT - 64 and list(q) == [64, qz.PAIR_LIMIT - 64]
    wide = qz.quantize_columns_compensated(w, factor, pairs=False).q.astype(int)[:, 0]
    assert abs(wide).sum() > qz.PAIR_LIMIT  # all 8 bits: nothing cut


@pytest.mark.parametrize("fmt", ["nbits", "qdq"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_a_weight_on_a_gguf_grid_is_found_and_stored_exactly(tmp_path, fmt, symmetric):
    """A GPT-2 whose body weights are snapped to Q4_1 grids (a model loaded from a GGUF file): each format stores
    them exactly (relative error ~1e-7, logits as the source's), as levels and float block offsets, which need
    no zero point (so --symmetric too); a weight not on a grid is never taken for one. ``nbits`` at the integer
    kernels' speed; ``qdq`` as constants onnxruntime folds at load into one fp32 weight each."""
    rng = np.random.default_rng(0)
    plain = rng.standard_normal((64, 48)).astype(np.float32)
    assert qz.on_grid(plain, 4, 32) is None
    snapped = on_q4_1_grid(plain)
    grid = qz.on_grid(snapped, 4, 32)
    assert grid is not None and grid.float_zero_point
    assert np.abs(qz.dequantize_blocked(grid) - snapped).max() <= 1e-6 * np.abs(snapped).max()
    rounded = qz.dequantize_blocked(qz.quantize_blocked(snapped, 4, 32, False))
    assert qz.relative_error(snapped, rounded) > 100 * qz.relative_error(snapped, qz.dequantize_blocked(grid))

    gguf = gpt2_on_gguf_grids(tmp_path / "gguf") / "onnx" / "model.onnx"
    model = load_model(gguf)
    if fmt == "qdq":  # blocked DequantizeLinear is opset 21 (quantize_engine/engine.py converts first)
        ConvertVersionPass(21, fallback=True)(model)
        model.ir_version = 10
    result = QuantizeWeightsPass(format=fmt, symmetric=symmetric, exclude={find_lm_head(model).matmul})(model)
    after = save_ir(model, tmp_path / f"{fmt}.onnx")
    assert result.quantized == 8 and all("on its grid (exact" in row["stored as"] for row in result.rows)
    assert max(row["rel. error"] for row in result.rows) < 1e-5
    assert "stored exactly" in result.notes[-1]
    if fmt == "nbits":
        # at the integer kernels' speed: no float zero points (onnxruntime runs those ~20-40x slower)
        nbits = [n for n in model.graph if n.op_type == "MatMulNBits"]
        assert nbits and all(len(n.inputs) == 3 for n in nbits)
        sums = [n for n in model.graph if n.op_type == "ReduceSum" and n.name.endswith("_block_sums")]
        assert len(sums) == len({n.inputs[0] for n in nbits})  # one per input, shared by its readers
    else:
        dq = [n for n in model.graph if n.op_type == "DequantizeLinear" and n.attributes.get_int("block_size")]
        assert len(dq) == 8 and all(n.inputs[0].const_value.dtype == ir.DataType.INT4 for n in dq)
        # folded at load as a web page loads it: onnxruntime runs the source's ops, one fp32 weight each
        ops = {path: Counter(ops_onnxruntime_runs(path, tmp_path / "optimized.onnx", FOLD)) for path in (gguf, after)}
        assert ops[after] == ops[gguf] and "DequantizeLinear" not in ops[after]
    feeds = lm_gate_feeds(gguf)[0]
    want = _outputs(gguf, feeds)["logits"]
    got = _outputs(after, feeds, FOLD if fmt == "qdq" else None)["logits"]
    cosine = float(np.dot(want.ravel(), got.ravel()) / (np.linalg.norm(want) * np.linalg.norm(got)))
    assert cosine > 0.99999


def test_grid_weights_reading_one_input_run_as_one_matmulnbits_and_compute_the_same():
    """A Llama decoder dequantized from GGUF grids: a layer's q, k and v read one input, as do gate and up. nbits
    stores each group as one MatMulNBits of their columns side by side, one block-offset product and a Split (not
    three of each); onnxruntime computes what the source does, before and after, on a prompt and a decode step."""
    import tempfile
    from pathlib import Path

    from onnxsmith.analysis.lm_signature import lm_signature
    from onnxsmith.runtime.lm_feeds import decode_step_feeds, lm_feeds
    from tests.support.check import assert_same_outputs
    from tests.support.lm_models import llama_folder, on_gguf_grids

    with tempfile.TemporaryDirectory() as tmp:
        folder = on_gguf_grids(llama_folder(), Path(tmp) / "gguf")
        source, model = (load_model(folder / "onnx" / "model.onnx") for _ in range(2))
    layers = len(lm_signature(model).past) // 2
    result = QuantizeWeightsPass(format="nbits", exclude={find_lm_head(model).matmul})(model)
    ops = Counter(n.op_type for n in model.graph)
    # per layer: q|k|v and gate|up packed, o and down alone; each product with its block offsets
    assert ops["MatMulNBits"] == 4 * layers and ops["Split"] == 2 * layers
    by_constant = [n for n in model.graph if n.op_type == "MatMul" and n.inputs[1].const_value is not None]
    assert len(by_constant) == 4 * layers + 1  # the offsets' products, and the head (excluded)
    assert f"{5 * layers} grid weights that read the same input" in " ".join(result.notes)
    packed = [row for row in result.rows if "one MatMulNBits for the weights" in row["stored as"]]
    assert len(packed) == 5 * layers and max(row["rel. error"] for row in packed) < 1e-5
    sig = lm_signature(source)
    prompt = lm_feeds(sig, np.array([[5, 9, 2, 7, 1, 3]], np.int64))
    assert_same_outputs(source, model, [prompt, decode_step_feeds(sig, past=4)], atol=1e-4, rtol=1e-4)
