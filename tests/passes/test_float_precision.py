"""FloatPrecisionPass: fp32 -> fp16 where the type rules allow, fp32 islands where told, checked in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.passes.cast_hygiene import round_trip_pairs
from onnxsmith.passes.float_precision import FloatPrecisionPass, PrecisionResult
from onnxsmith.runtime.inputs import random_inputs
from tests.support.check import assert_pass_preserves_outputs, save_ir
from tests.support.models import mlp, with_if_subgraph

F16 = ir.DataType.FLOAT16
F32 = ir.DataType.FLOAT
# fp16 rounding of weights and activations: what a small float net loses in fp16
ATOL, RTOL = 3e-2, 3e-2


def _convert(path, **options) -> tuple[ir.Model, PrecisionResult]:
    model = load_model(path)
    return model, FloatPrecisionPass(**options)(model)


def _loads_natively(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_weights_and_compute_to_fp16_io_kept_fp32(save_proto, tmp_path):
    source = save_proto(mlp(hidden=512))
    model, conversion = _convert(source)
    assert {v.dtype for v in model.graph.initializers.values()} == {F16}
    assert [v.dtype for v in model.graph.inputs] == [F32] and [v.dtype for v in model.graph.outputs] == [F32]
    assert sum(conversion.low_nodes.values()) == 5 and not conversion.kept
    assert conversion.casts_added == 2  # the input down, the output up
    after = save_ir(model, tmp_path / "after.onnx")
    assert after.stat().st_size < 0.6 * source.stat().st_size
    comparison = assert_pass_preserves_outputs(source, after, tmp_path, atol=ATOL, rtol=RTOL)
    assert comparison.modes["candidate"] == "storage-faithful fp16"
    _loads_natively(after)


def test_fp16_io_when_asked(save_proto, tmp_path):
    source = save_proto(mlp())
    model, conversion = _convert(source, keep_io_types=False)
    assert [v.dtype for v in model.graph.inputs] == [F16] and [v.dtype for v in model.graph.outputs] == [F16]
    assert conversion.casts_added == 0
    assert_pass_preserves_outputs(source, model, tmp_path, atol=ATOL, rtol=RTOL)


def test_kept_tensor_makes_an_island_its_producer_and_readers_fp32(save_proto, tmp_path):
    source = save_proto(mlp())
    model, conversion = _convert(source, keep_fp32={"h1": "measured over range"})
    nodes = {n.name: n for n in model.graph}
    assert nodes["add1"].outputs[0].dtype == F32  # writes h1
    assert nodes["relu"].outputs[0].dtype == F32  # reads h1
    assert nodes["mm1"].outputs[0].dtype == F16 and nodes["mm2"].outputs[0].dtype == F16
    assert set(conversion.kept) == {"add1", "relu"}
    assert "measured over range" in conversion.kept["add1"]
    # Exactly one Cast at each island border, never a round trip.
    assert conversion.casts_added == 4 and not round_trip_pairs(model)
    assert_pass_preserves_outputs(source, model, tmp_path, atol=ATOL, rtol=RTOL)


def _shape_arithmetic_model() -> onnx.ModelProto:
    """y = x * Range(0, Cast<float>(Shape(x)[1]), 1): a float Range computed from a shape (as TorchScript's RoPE)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["n"], axis=0),
        helper.make_node("Cast", ["n"], ["n_f"], to=TensorProto.FLOAT),
        helper.make_node("Range", ["zero_f", "n_f", "one_f"], ["positions"]),
        helper.make_node("Div", ["positions", "n_f"], ["fraction"]),
        helper.make_node("Mul", ["x", "fraction"], ["scaled"]),
        helper.make_node("MatMul", ["scaled", "w"], ["y"]),
    ]
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        nodes,
        "shape_arith",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [
            numpy_helper.from_array(np.array(1, np.int64), "one"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
            numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_arithmetic_and_range_stay_as_they_are(save_proto, tmp_path):
    source = save_proto(_shape_arithmetic_model())
    model, conversion = _convert(source)
    types = {n.op_type: n.outputs[0].dtype for n in model.graph}
    assert types["Range"] == F32 and types["Div"] == F32  # sizes, not activations (fp16 Range has no kernel)
    assert types["MatMul"] == F16 and types["Mul"] == F16
    assert model.graph.initializers["zero_f"].dtype == F32 and model.graph.initializers["w"].dtype == F16
    assert conversion.shape_nodes == 2
    after = save_ir(model, tmp_path / "after.onnx")
    _loads_natively(after)
    assert_pass_preserves_outputs(source, after, tmp_path, atol=ATOL, rtol=RTOL, shapes={"x": (2, 6)})


def _index_arithmetic_model() -> onnx.ModelProto:
    """DINOv2's interpolated position grid, reduced: sizes computed in float from constants and shapes.

    ``side = Cast<int64>(Floor(Pow(2049, 1)))`` picks how many rows of ``table`` to keep (2049:
    2048 in fp16); a cubic Resize's ``scales`` come from ``Div(Cast<float>(Shape(x)), 4)``
    over a constant; ``y = Resize(x) + Slice(table)``, both [1, 1, 2049 // 2049 * ..]: see below.
    """
    nodes = [
        helper.make_node("Pow", ["n", "one_f"], ["n_pow"], name="pow"),
        helper.make_node("Floor", ["n_pow"], ["n_floor"], name="floor"),
        helper.make_node("Cast", ["n_floor"], ["side"], to=TensorProto.INT64, name="to_int"),
        helper.make_node("Unsqueeze", ["side", "zero_i"], ["end"], name="end"),
        helper.make_node("Slice", ["table", "zero_1d", "end", "zero_1d"], ["rows"], name="rows"),
        helper.make_node("ReduceMax", ["rows"], ["peak"], keepdims=1, axes=[0], name="peak"),
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
        helper.make_node("Cast", ["x_shape"], ["x_shape_f"], to=TensorProto.FLOAT, name="shape_f"),
        helper.make_node("Div", ["x_shape_f", "three_f"], ["thirds"], name="thirds"),
        helper.make_node("Mul", ["thirds", "seven_f"], ["wanted"], name="wanted"),
        helper.make_node("Div", ["wanted", "x_shape_f"], ["ratio"], name="ratio"),
        helper.make_node("Slice", ["ratio", "two_1d", "four_1d", "zero_1d"], ["hw"], name="hw"),
        helper.make_node("Concat", ["ones_f", "hw"], ["scales"], axis=0, name="scales"),
        helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="cubic", name="resize"),
        helper.make_node("Mul", ["up", "peak"], ["y"], name="out"),
    ]
    inits = [
        numpy_helper.from_array(np.array(2049.0, np.float32), "n"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
        numpy_helper.from_array(np.array(3.0, np.float32), "three_f"),
        numpy_helper.from_array(np.array(7.0, np.float32), "seven_f"),
        numpy_helper.from_array(np.ones(2, np.float32), "ones_f"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_i"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_1d"),
        numpy_helper.from_array(np.array([2], np.int64), "two_1d"),
        numpy_helper.from_array(np.array([4], np.int64), "four_1d"),
        # row 2048 (the 2049th) holds the largest value: dropped if 2049 becomes 2048
        numpy_helper.from_array(np.concatenate([np.ones(2048), [5.0]]).astype(np.float32).reshape(2049, 1), "table"),
    ]
    graph = helper.make_graph(
        nodes,
        "index_arithmetic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_index_arithmetic_on_constants_and_resize_scales_stay_exact(save_proto, tmp_path):
    source = save_proto(_index_arithmetic_model())
    model, conversion = _convert(source)
    types = {n.name: n.outputs[0].dtype for n in model.graph}
    for name in ("pow", "floor", "thirds", "wanted", "ratio", "hw", "scales"):
        assert types[name] == F32, name  # what becomes an integer or a Resize scale
    assert types["rows"] == F16 and types["out"] == F16  # the data itself is converted
    assert model.graph.initializers["n"].dtype == F32 and model.graph.initializers["table"].dtype == F16
    assert conversion.shape_nodes >= 2
    after = save_ir(model, tmp_path / "after.onnx")
    _loads_natively(after)
    # 2049 rows, the last one (5.0) kept; a cubic Resize by 7/3 on both sides: [1, 1, 14, 21].
    comparison = assert_pass_preserves_outputs(source, after, tmp_path, atol=ATOL, rtol=RTOL)
    assert comparison.outputs[0].shape == (1, 1, 14, 21)


def test_weights_inside_if_branches_are_converted_interface_kept(save_proto, tmp_path):
    source = save_proto(with_if_subgraph())
    model, _ = _convert(source)
    branches = [
        attr.value for n in model.graph for attr in n.attributes.values() if attr.type == ir.AttributeType.GRAPH
    ]
    assert len(branches) == 2
    for branch in branches:
        assert [v.dtype for v in branch.initializers.values()] == [F16]
        assert [v.dtype for v in branch.outputs] == [F32]  # the If keeps its fp32 interface
    after = save_ir(model, tmp_path / "after.onnx")
    _loads_natively(after)
    feeds = [{"x": np.full((2, 4), sign, np.float32) * np.arange(1, 5, dtype=np.float32)} for sign in (1, -1)]
    assert_pass_preserves_outputs(source, after, tmp_path, feeds=feeds, atol=ATOL, rtol=RTOL)


def _constant_node_model() -> onnx.ModelProto:
    """PP-OCR style: every weight in a Constant node, none in initializers; one huge constant."""
    rng = np.random.default_rng(4)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 8], rng.standard_normal(32).astype(np.float32).tolist())
    nodes = [
        helper.make_node("Constant", [], ["w_c"], value=w),
        helper.make_node("Constant", [], ["big"], value_float=1e6),
        helper.make_node("MatMul", ["x", "w_c"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Div", ["r", "big"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "consts",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_constant_node_weights_converted_unless_out_of_range(save_proto, tmp_path):
    source = save_proto(_constant_node_model())
    model, conversion = _convert(source)
    constants = {n.outputs[0].name: n.outputs[0].dtype for n in model.graph if n.op_type == "Constant"}
    assert constants == {"w_c": F16, "big": F32}  # 1e6 is inf in fp16: the Div that reads it stays fp32
    w_c = next(n for n in model.graph if n.outputs[0].name == "w_c")
    assert w_c.attributes["value"].value.dtype == F16
    assert any("1e+06" in reason for reason in conversion.kept.values())
    assert_pass_preserves_outputs(source, model, tmp_path, atol=ATOL, rtol=RTOL)


def _matmul_model(w: np.ndarray) -> onnx.ModelProto:
    """x -> MatMul(x, w) -> y, the weight an initializer."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, w.shape[1]])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_weight_whose_dead_columns_flush_to_zero_is_stored_fp16(save_proto, tmp_path):
    # PP-OCRv6's det head: most values of a trained weight are ~1e-7..1e-22 (dead output channels), the rest
    # carry what it computes. Rounded to fp16 the tiny ones flush to zero; the tensor as a whole moves 2e-4.
    rng = np.random.default_rng(7)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    w[:, 3:] *= np.float32(1e-9)  # 5 of 8 columns dead: 62% of the values below fp16's smallest subnormal
    source = save_proto(_matmul_model(w))
    model, conversion = _convert(source)
    assert model.graph.initializers["w"].dtype == F16 and not conversion.kept
    # What it computes survives: the live columns as fp16 keeps them, the dead ones ~0 either way.
    assert_pass_preserves_outputs(source, model, tmp_path, atol=1e-6, rtol=RTOL)


def test_a_weight_fp16_cannot_hold_stays_fp32_with_its_reader(save_proto, tmp_path):
    # Every value ~3e-8: an fp16 subnormal keeps one or two bits of it. Stored fp16 the product would be off
    # by tens of percent; kept fp32 (with the MatMul that reads it) it is exact.
    rng = np.random.default_rng(8)
    w = (3e-8 * rng.standard_normal((16, 8))).astype(np.float32)
    assert np.abs(w.astype(np.float16).astype(np.float32) - w).max() > 0.1 * np.abs(w).max()
    source = save_proto(_matmul_model(w))
    model, conversion = _convert(source)
    assert model.graph.initializers["w"].dtype == F32
    assert "||w16 - w|| / ||w||" in conversion.kept[next(iter(conversion.kept))]
    assert_pass_preserves_outputs(source, model, tmp_path, atol=1e-12, rtol=1e-4)


def test_store_low_weights_are_widened_for_kept_nodes_only(save_proto, tmp_path):
    # 'w' is read by a node kept fp32 only: stored fp16, widened by a Cast. 's' is also a Resize's scales,
    # which take fp32 only and compute sizes: it stays exactly as it is, although store_low names it.
    rng = np.random.default_rng(9)
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["m0"], name="scale_w"),
        helper.make_node("Mul", ["m0", "s"], ["m"], name="scale_s"),
        helper.make_node("Resize", ["m", "", "s"], ["y"], name="resize", mode="linear"),
    ]
    graph = helper.make_graph(
        nodes,
        "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([1, 1, 1.7, 2.3], np.float32), "s"),
        ],
    )
    source = save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    keep = {"m0": "asked", "m": "asked"}
    model, conversion = _convert(source, keep_fp32=keep, store_low={"w": "test", "s": "test"})
    w, s = model.graph.initializers["w"], model.graph.initializers["s"]
    assert w.dtype == F16 and [u.op_type for u, _ in w.uses()] == ["Cast"]
    assert s.dtype == F32 and conversion.weights_fp32["s"][2] == "writes 'm': asked"
    assert set(conversion.weights_cast_at_load) == {"w"}
    assert_pass_preserves_outputs(source, model, tmp_path, atol=1e-3, rtol=1e-3)


def _contrib_model() -> onnx.ModelProto:
    """x -> SkipLayerNormalization(x, skip, gamma, beta) -> BiasGelu(., b) -> MatMul: com.microsoft fusions."""
    rng = np.random.default_rng(5)
    hidden = 16
    nodes = [
        helper.make_node(
            "SkipLayerNormalization",
            ["x", "skip", "gamma", "beta"],
            ["normed", "mean", "inv_std"],
            domain="com.microsoft",
            epsilon=1e-5,
        ),
        helper.make_node("BiasGelu", ["normed", "bias"], ["act"], domain="com.microsoft"),
        helper.make_node("MatMul", ["act", "w"], ["y"]),
        helper.make_node("ReduceMax", ["mean"], ["mean_max"], keepdims=0),
    ]
    inits = [
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), "gamma"),
        numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np.float32), "beta"),
        numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal((hidden, 4)).astype(np.float32), "w"),
    ]
    graph = helper.make_graph(
        nodes,
        "contrib",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, hidden]),
            helper.make_tensor_value_info("skip", TensorProto.FLOAT, [2, 5, hidden]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 4]),
            helper.make_tensor_value_info("mean_max", TensorProto.FLOAT, []),
        ],
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def test_contrib_ops_follow_their_type_rules(save_proto, tmp_path):
    source = save_proto(_contrib_model())
    model, conversion = _convert(source)
    nodes = {n.op_type: n for n in model.graph}
    skip_ln = nodes["SkipLayerNormalization"]
    assert skip_ln.outputs[0].dtype == F16 and nodes["BiasGelu"].outputs[0].dtype == F16
    assert skip_ln.outputs[1].dtype == F32  # 'mean' is always fp32 (type U)
    for name in ("gamma", "beta", "bias"):
        assert model.graph.initializers[name].dtype == F16
    assert not conversion.unknown_ops
    after = save_ir(model, tmp_path / "after.onnx")
    _loads_natively(after)
    assert_pass_preserves_outputs(source, after, tmp_path, atol=ATOL, rtol=RTOL)


def test_unknown_custom_op_stays_fp32_with_a_note():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mystery", ["r"], ["y"], domain="acme.ops")]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = ir.serde.deserialize_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme.ops", 1)])
    )
    conversion = FloatPrecisionPass()(model)
    assert conversion.unknown_ops == ["acme.ops::Mystery"]
    mystery = next(n for n in model.graph if n.op_type == "Mystery")
    assert mystery.inputs[0].dtype == F32 and mystery.outputs[0].dtype == F32


def test_deterministic(save_proto, tmp_path):
    source = save_proto(with_if_subgraph())
    first = save_ir(_convert(source)[0], tmp_path / "a.onnx")
    second = save_ir(_convert(source)[0], tmp_path / "b.onnx")
    assert first.read_bytes() == second.read_bytes()


def test_random_inputs_fit_both(save_proto):
    """The converted model keeps the source's input spec, so the same feeds run both."""
    source = save_proto(mlp())
    model, _ = _convert(source)
    assert random_inputs(model, seed=1)["x"].dtype == np.float32
