"""The precision engine's decisions on small graphs: data in (a model, ranges as numbers), a Plan out.

Nothing runs here: the ranges are written down, as runtime/ would have measured them. That the
decisions, applied, keep a model's outputs is tested by running models (tests/test_fp16.py,
tests/precision/test_engine.py).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis.measurements import TensorRange
from onnxsmith.irutil.types import infer_types
from onnxsmith.precision.plan import (
    NORM_REASON,
    SKIP_STREAM_REASON,
    STORE_LOW_BUDGET,
    TAIL_REASON,
    WRITER_REASON,
    Settings,
    check_store_low,
    decide,
    decide_streams,
)


def _r(name: str, absmax: float, elements: int = 64, tiny: float = 0.0) -> TensorRange:
    return TensorRange(name, "", "", 0, absmax, 0, tiny, "FLOAT", elements)


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> ir.Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    infer_types(model)
    return model


def _pre_ln(blocks: int = 3) -> ir.Model:
    """x -> (LN -> MatMul w_i -> + ) x blocks -> LN -> y: a pre-LN residual stream s0..s_blocks."""
    d = 8
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.ones(d, np.float32), "gamma")]
    nodes = [helper.make_node("Identity", ["x"], ["s0"], name="embed")]
    for i in range(blocks):
        inits.append(numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32), f"w{i}"))
        nodes += [
            helper.make_node("LayerNormalization", [f"s{i}", "gamma"], [f"n{i}"], name=f"ln{i}", axis=-1),
            helper.make_node("MatMul", [f"n{i}", f"w{i}"], [f"b{i}"], name=f"proj{i}"),
            helper.make_node("Add", [f"s{i}", f"b{i}"], [f"s{i + 1}"], name=f"add{i}"),
        ]
    nodes.append(helper.make_node("LayerNormalization", [f"s{blocks}", "gamma"], ["y"], name="final", axis=-1))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, d])
    # The stream starts at a MatMul so that it can be rescaled (an input cannot).
    nodes[0] = helper.make_node("MatMul", ["x", "w_in"], ["s0"], name="embed")
    inits.append(numpy_helper.from_array(np.eye(d, dtype=np.float32), "w_in"))
    return _model(nodes, [x], [y], inits)


def _stream_ranges(massive: float) -> list[TensorRange]:
    """Block 1's projection writes ``massive`` into the stream; everything else is O(1)."""
    ranges = [_r("x", 1.0), _r("s0", 1.0), _r("y", 3.0)]
    for i in range(3):
        ranges += [_r(f"n{i}", 3.0), _r(f"b{i}", massive if i == 1 else 1.0)]
        ranges.append(_r(f"s{i + 1}", massive if i >= 1 else 2.0))
    return ranges


def test_an_overflowing_stream_stays_fp32_with_the_branch_that_writes_it():
    model = _pre_ln()
    ranges = _stream_ranges(1.5e5)
    (stream,) = decide_streams(model, ranges, Settings())
    assert stream.overflows and stream.kept_fp32 and stream.scale == 1.0
    assert stream.peak == 1.5e5 and stream.peak_tensor == "s2"
    assert {f"s{i}" for i in range(4)} <= set(stream.keep_fp32)
    # The writer branch (block 1's LayerNorm and projection) is kept too; other blocks' are not.
    assert stream.keep_fp32["b1"].startswith(WRITER_REASON) and stream.keep_fp32["n1"].startswith(WRITER_REASON)
    assert "b0" not in stream.keep_fp32 and "b2" not in stream.keep_fp32
    assert stream.writers == [("b1", 1.5e5, 2)]
    plan = decide(model, ranges, Settings(), [stream])
    assert set(stream.keep_fp32) <= set(plan.keep_fp32)
    assert set(plan.unsafe) == {"b1", "s2", "s3"}  # over 65,504 / 4


def test_a_stream_that_fits_is_left_alone():
    model = _pre_ln()
    (stream,) = decide_streams(model, _stream_ranges(100.0), Settings())
    assert not stream.overflows and not stream.kept_fp32 and stream.scale == 1.0 and not stream.keep_fp32


def test_carried_in_fp16_the_stream_is_rescaled_by_a_power_of_two_and_nothing_is_over_range():
    model = _pre_ln()
    ranges = _stream_ranges(1.5e5)
    (stream,) = decide_streams(model, ranges, Settings(residual_fp32=False))
    assert stream.scale == 1 / 16 and not stream.kept_fp32  # 1.5e5 / 16 = 9.4e3 <= 16,376
    plan = decide(model, ranges, Settings(residual_fp32=False), [stream])
    assert plan.scaled["s2"] == 1 / 16 and not plan.unsafe


def test_fused_settings_rescale_an_overflowing_stream_and_keep_nothing_of_it():
    model = _pre_ln()
    (stream,) = decide_streams(model, _stream_ranges(1.5e5), Settings.for_fused_graph())
    assert stream.scale == 1 / 16 and not stream.kept_fp32 and not stream.keep_fp32
    (fits,) = decide_streams(model, _stream_ranges(100.0), Settings.for_fused_graph())
    assert fits.scale == 1.0  # rescaled only when it overflows


def test_asked_to_rescale_a_stream_that_cannot_be_says_why():
    model = _pre_ln()
    model.graph.outputs.append(next(v for n in model.graph for v in n.outputs if v.name == "s1"))
    (stream,) = decide_streams(model, _stream_ranges(1.5e5), Settings(rescale=True))
    assert stream.scale == 1.0 and stream.note == "not rescaled: 's1' is a graph output"


def test_underflow_and_range_islands_and_the_caller_s_tensors():
    model = _pre_ln()
    ranges = _stream_ranges(10.0)
    ranges[3] = _r("n0", 3.0, tiny=0.9)  # mostly below fp16's smallest normal
    plan = decide(model, ranges, Settings(), keep_fp32={"b2": "asked"})
    assert "smallest normal" in plan.keep_fp32["n0"] and plan.keep_fp32["b2"] == "asked"
    assert set(plan.unsafe) == {"n0"}


def test_op_policy_and_fused_policies_are_node_reasons():
    d = 4
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["r"], name="sum", keepdims=1),
        helper.make_node("LayerNormalization", ["x", "g"], ["n"], name="ln", axis=-1),
        helper.make_node("Gather", ["n", "zero"], ["cls"], name="pick", axis=1),
        helper.make_node("MatMul", ["cls", "w"], ["head"], name="head"),
        helper.make_node("Add", ["n", "r"], ["y"], name="add"),
    ]
    inits = [
        numpy_helper.from_array(np.ones(d, np.float32), "g"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.ones((d, 2), np.float32), "w"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5, d])
    outs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("head", TensorProto.FLOAT, None),
    ]
    model = _model(nodes, [x], outs, inits)
    named = {n.name: n for n in model.graph}
    ranges = [_r(v, 1.0, elements=40) for v in ("x", "r", "n", "y")] + [_r("cls", 1.0, 8), _r("head", 1.0, 4)]
    plain = decide(model, ranges, Settings(small_fp32=False))
    assert set(plain.node_reasons) == {named["sum"]} and "accumulates" in plain.node_reasons[named["sum"]]
    fused = decide(model, ranges, Settings.for_fused_graph())
    assert fused.node_reasons[named["ln"]] == NORM_REASON
    assert fused.node_reasons[named["pick"]] == TAIL_REASON and fused.node_reasons[named["head"]] == TAIL_REASON
    assert named["add"] not in fused.node_reasons


def test_a_fused_post_ln_stream_is_written_in_fp32_and_read_in_fp16_by_its_projections():
    """BERT-like (post-LN): the stream is both SkipLayerNormalization's skip and the projections' input."""
    d = 4
    nodes = [
        helper.make_node("Add", ["x", "pos"], ["e"], name="embed"),
        helper.make_node("MatMul", ["e", "w"], ["q"], name="proj"),
        helper.make_node(
            "SkipLayerNormalization", ["q", "e", "g", "b"], ["y"], name="skipln", domain="com.microsoft", epsilon=1e-5
        ),
    ]
    inits = [
        numpy_helper.from_array(np.ones(d, np.float32), "pos"),
        numpy_helper.from_array(np.eye(d, dtype=np.float32), "w"),
        numpy_helper.from_array(np.ones(d, np.float32), "g"),
        numpy_helper.from_array(np.zeros(d, np.float32), "b"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5, d])
    model = _model(nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model.opset_imports["com.microsoft"] = 1
    named = {n.name: n for n in model.graph}
    plan = decide(model, [_r(v, 1.0, 40) for v in ("x", "e", "q", "y")], Settings.for_fused_graph())
    assert plan.node_reasons[named["embed"]] == SKIP_STREAM_REASON  # the stream is written in fp32
    assert plan.node_reasons[named["skipln"]] == NORM_REASON
    assert named["proj"] not in plan.node_reasons and "e" not in plan.keep_fp32  # and read in fp16


@pytest.mark.parametrize("settings", [Settings(), Settings.for_fused_graph()])
def test_deciding_changes_nothing(settings):
    model = _pre_ln()
    before = ir.serde.serialize_model(model).SerializeToString()
    decide(model, _stream_ranges(1.5e5), settings, decide_streams(model, _stream_ranges(1.5e5), settings))
    assert ir.serde.serialize_model(model).SerializeToString() == before


# ------------------------------------------------------------------ the cost rule ("small" nodes)


def _heads(count: int, shared: bool) -> ir.Model:
    """x[1, 8] -> MatMul(x, big) = a[1, 1000], and ``count`` heads MatMul(x, w_i) = y_i[1, 8] (each a
    256-byte weight, or one weight they all read through a Transpose when ``shared``)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 1000)).astype(np.float32), "big")]
    nodes = [helper.make_node("MatMul", ["x", "big"], ["a"], name="body")]
    if shared:
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"))
        nodes.append(helper.make_node("Transpose", ["w"], ["wt"], name="wt", perm=[1, 0]))
    for i in range(count):
        if not shared:
            inits.append(numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", ["x", "wt" if shared else f"w{i}"], [f"y{i}"], name=f"head{i}"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["a"] + [f"y{i}" for i in range(count)]]
    return _model(nodes, [x], outs, inits)


def _head_ranges(count: int, wt_elements: int = 64) -> list[TensorRange]:
    return [_r("x", 1.0, 8), _r("a", 1.0, 1000), _r("wt", 1.0, wt_elements)] + [
        _r(f"y{i}", 1.0, 8) for i in range(count)
    ]


def _small_heads(plan) -> set[str]:
    return {n.name for n, why in plan.node_reasons.items() if why.startswith("small")}


def test_small_nodes_together_hold_at_most_a_twentieth_of_the_weights():
    # 10 heads of 256 bytes next to a 32,000-byte body: each is under 1 % of the weights, all ten 7 %.
    model = _heads(10, shared=False)
    plan = decide(model, _head_ranges(10), Settings())
    kept = _small_heads(plan)
    assert len(kept) == 6  # 6 x 256 = 1,536 <= 5 % of 34,560 < 7 x 256
    assert all(f"y{i}" in plan.small for i in range(10))  # all small; the budget chose among them


def test_a_weight_shared_by_small_nodes_counts_once():
    model = _heads(10, shared=True)
    plan = decide(model, _head_ranges(10), Settings())
    assert _small_heads(plan) == {f"head{i}" for i in range(10)}  # one 256-byte weight for all


def test_a_weight_computed_at_run_time_is_not_the_largest_activation():
    # rxnmap: a Transpose of a shared weight measured as the biggest tensor made every activation "small".
    model = _heads(2, shared=True)
    plan = decide(model, _head_ranges(2, wt_elements=10**6), Settings())
    assert set(plan.small) == {"x", "y0", "y1"} and plan.small["y0"] == "8 elements, 1/125 of the largest activation"
    assert "a" not in plan.small and "wt" not in plan.small


def test_a_tensor_growing_faster_than_the_largest_activation_is_not_small():
    # Attention scores [seq, seq] are 1/128 of [seq, 1000] at 8 tokens, not at 512.
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 1000)).astype(np.float32), "big"),
        numpy_helper.from_array(np.array([0], np.int64), "first"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "big"], ["a"], name="body"),
        helper.make_node("Transpose", ["x"], ["xt"], name="xt", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "xt"], ["scores"], name="scores"),
        helper.make_node("Gather", ["x", "first"], ["cls"], name="cls", axis=0),
        helper.make_node("Sigmoid", ["cls"], ["gate"], name="gate"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 8])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "scores", "gate")]
    model = _model(nodes, [x], outs, inits)
    ranges = [_r("x", 1.0, 64), _r("a", 1.0, 8000), _r("xt", 1.0, 64), _r("scores", 1.0, 64)]
    ranges += [_r("cls", 1.0, 8), _r("gate", 1.0, 8)]
    plan = decide(model, ranges, Settings())
    assert "scores" not in plan.small  # [seq, seq]: seq twice, the largest [seq, 1000] once
    assert "gate" in plan.small  # [1, 8]: no symbolic dim at all


# ------------------------------------------------------------------ recurrent weights stored low


def _lstm() -> ir.Model:
    rng = np.random.default_rng(0)
    hidden, d = 4, 3
    inits = [
        numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, d)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32), "R"),
        numpy_helper.from_array(rng.standard_normal((1, 8 * hidden)).astype(np.float32), "B"),
    ]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], name="lstm", hidden_size=hidden)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, d])
    return _model(nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def test_a_recurrent_cell_computes_in_fp32_and_its_weights_may_be_stored_low():
    model = _lstm()
    plan = decide(model, [_r("x", 1.0, 15), _r("y", 1.0, 20)], Settings(small_fp32=False))
    (lstm,) = model.graph
    assert "LSTM" in plan.node_reasons[lstm]
    assert set(plan.store_low) == {"W", "R", "B"} and "LSTM 'lstm'" in plan.store_low["W"]


def test_recurrent_weights_stay_stored_low_only_if_rounding_them_moves_the_outputs_within_the_budget():
    reference = {"y": np.linspace(-10, 10, 50, dtype=np.float32)}
    budget = STORE_LOW_BUDGET[ir.DataType.FLOAT16]  # 0.3 of the fp16 gate's relative error
    close = {"y": reference["y"] + 10 * budget / 4}
    far = {"y": reference["y"] + 10 * budget * 4}
    plan = decide(_lstm(), [], Settings(small_fp32=False))
    check_store_low(plan, plan.store_low_groups[0], reference, close)
    assert set(plan.store_low) == {"W", "R", "B"} and "stored fp16" in plan.store_low_checked[0]
    plan = decide(_lstm(), [], Settings(small_fp32=False))
    check_store_low(plan, plan.store_low_groups[0], reference, far)
    assert plan.store_low == {} and "kept fp32: rounding them to fp16 moved output 'y' by" in plan.store_low_checked[0]
