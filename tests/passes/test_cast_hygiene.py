"""CastHygienePass: no fp16 round trips between fp32 nodes, no duplicate or orphaned Casts."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.cast_hygiene import CastHygienePass, count_casts, round_trip_pairs
from onnxsmith.verify.compare import compare_models
from tests.support.check import assert_pass_preserves_outputs, save_ir

F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT


def _cast(src, dst, to):
    return helper.make_node("Cast", [src], [dst], to=to, name=f"cast_{dst}")


def _messy() -> onnx.ModelProto:
    """Two fp32 Adds with an fp16 round trip between them (as an fp16 converter leaves a blocked op),
    two identical down-casts, an fp16 -> fp32 -> fp16 identity pair, and an output produced by a Cast."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["big"], name="square"),  # up to 1e8: overflows fp16
        _cast("big", "big_h", F16),
        _cast("big", "big_h2", F16),  # duplicate of the one above
        _cast("big_h", "big_f", F32),  # round trip back to fp32
        helper.make_node("Add", ["big_f", "x"], ["sum"], name="add"),  # an fp32 node reading the round trip
        helper.make_node("Relu", ["big_h2"], ["r_h"], name="relu_h"),  # an fp16 node
        _cast("r_h", "r_f", F32),
        _cast("r_f", "r_h2", F16),  # identity pair: fp16 -> fp32 -> fp16
        helper.make_node("Neg", ["r_h2"], ["n_h"], name="neg_h"),
        _cast("n_h", "out_n", F32),
        helper.make_node("Sqrt", ["sum"], ["out_s"], name="sqrt"),
    ]
    graph = helper.make_graph(
        nodes,
        "messy",
        [helper.make_tensor_value_info("x", F32, [4])],
        [helper.make_tensor_value_info("out_s", F32, [4]), helper.make_tensor_value_info("out_n", F32, [4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_round_trips_duplicates_and_orphans_are_removed(save_proto, tmp_path):
    source = save_proto(_messy())
    model = load_model(source)
    infer_types(model)
    assert len(round_trip_pairs(model)) == 1
    before = count_casts(model)
    counts = CastHygienePass()(model).counts
    assert (counts.round_trips, counts.identities, counts.merged) == (1, 1, 1)
    assert not round_trip_pairs(model)
    # Left: the single down-cast feeding the fp16 Relu, and the Cast producing output 'out_n'.
    assert count_casts(model) == 2 < before
    assert [v.name for v in model.graph.outputs] == ["out_s", "out_n"]
    add = next(n for n in model.graph if n.name == "add")
    assert add.inputs[0].name == "big"  # reads the fp32 value itself
    after = save_ir(model, tmp_path / "after.onnx")

    # 'square' reaches 1e8: with the round trip the Add sees inf, without it the true value.
    feeds = [{"x": np.array([1e4, 2.0, -3.0, 0.5], np.float32)}]
    with_trip = compare_models(source, source, feeds)
    cleaned = compare_models(source, after, feeds, atol=1e-2, rtol=1e-2)
    assert with_trip.outputs[0].nonfinite_ref == 1  # the source: sqrt(inf)
    assert cleaned.outputs[0].nonfinite_test == 0
    # Everywhere the source is finite, the cleaned model agrees with it.
    small = [{"x": np.array([100.0, 2.0, -3.0, 0.5], np.float32)}]
    assert_pass_preserves_outputs(source, after, tmp_path, feeds=small, atol=1e-2, rtol=1e-3)


def test_a_model_without_casts_is_unchanged(save_proto):
    from tests.support.models import mlp

    model = load_model(save_proto(mlp()))
    infer_types(model)
    result = CastHygienePass()(model)
    assert not result.modified and count_casts(model) == 0


def test_float_to_int_casts_are_left_alone(save_proto):
    nodes = [_cast("x", "x_h", F16), _cast("x_h", "x_i", TensorProto.INT32), _cast("x_i", "y", F32)]
    graph = helper.make_graph(
        nodes, "int", [helper.make_tensor_value_info("x", F32, [3])], [helper.make_tensor_value_info("y", F32, [3])]
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    infer_types(model)
    CastHygienePass()(model)
    assert count_casts(model) == 3
