"""Born int32: int64 index regions that provably fit int32 are stored and computed as int32."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.passes.narrow_int64 import REGION_OPS, NarrowInt64Pass, NarrowInt64Result, values_to_evaluate
from onnxsmith.probes.evaluate import evaluate_min_max
from tests.support.check import assert_pass_preserves_outputs
from tests.support.surgery_models import folded_index, hitnet_bloat

INT32, INT64 = ir.DataType.INT32, ir.DataType.INT64


# atol=0 asks for bit-identical outputs; compare's relative error then divides 0 by 0 where both are 0.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")


def _narrowed(path, min_bytes: int = 64 * 1024) -> tuple[ir.Model, NarrowInt64Result]:
    model = load_model(path)
    infer_types(model)
    narrow = NarrowInt64Pass(min_bytes, evaluated=evaluate_min_max(model, values_to_evaluate(model, min_bytes)))(model)
    return model, narrow


def _values(model: ir.Model) -> dict[str, ir.Value]:
    return ir.convenience.create_value_mapping(model.graph)


def test_computed_grid_is_born_int32(save_proto, tmp_path):
    source = save_proto(hitnet_bloat(height=64, width=64, tile1=3, tile2=2), "grid.onnx")
    model, narrow = _narrowed(source)
    [report] = narrow.reports
    assert report.narrowed and report.bounds == (0, 8) and report.proof == "static bounds"
    values = _values(model)
    # The whole chain is int32 from where it is made: the Range's constant inputs are int32 ...
    for name in ("start", "limit", "delta", "disparities", "grid", "grid_tiled", "index"):
        assert values[name].dtype == INT32, name
    assert values["start"].const_value.dtype == INT32
    # ... the shape and repeat inputs stay int64, and no Cast sits in front of GatherElements.
    assert values["expand_shape"].dtype == INT64 and values["reps1"].dtype == INT64
    gather = next(n for n in model.graph if n.op_type == "GatherElements")
    assert gather.inputs[1].producer().op_type == "Tile"
    # The int64 graph output keeps its name and type: a Cast back after the (small) Slice.
    [head] = [o for o in model.graph.outputs if o.name == "index_head"]
    assert head.dtype == INT64 and head.producer().op_type == "Cast"
    assert head.producer().inputs[0].producer().op_type == "Slice"
    assert report.saved_runtime_bytes >= 64 * 64 * 48 * 4
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)


def test_stored_index_constant_is_halved(save_proto, tmp_path):
    source = save_proto(folded_index(rows=64, cols=4096), "folded.onnx")
    model, narrow = _narrowed(source)
    index = model.graph.initializers["index"].const_value
    assert index.dtype == INT32 and index.nbytes == 64 * 4096 * 4
    assert narrow.reports[0].saved_bytes == 64 * 4096 * 4
    assert not any(n.op_type == "Cast" for n in model.graph)
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)


def _gather_model(
    index: onnx.TensorProto | None,
    producer: list[onnx.NodeProto] = (),
    *,
    index_input: bool = False,
    extra_inputs=(),
    rows: int = 100,
) -> onnx.ModelProto:
    table = numpy_helper.from_array(np.arange(rows * 4, dtype=np.float32).reshape(rows, 4), "table")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, rows])]
    if index_input:
        inputs.append(helper.make_tensor_value_info("index", TensorProto.INT64, [8]))
    inputs.extend(extra_inputs)
    nodes = [
        *producer,
        helper.make_node("Gather", ["table", "index"], ["rows"], name="gather"),
        helper.make_node("Add", ["rows", "rows"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "gather",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [table] + ([index] if index is not None else []),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_values_outside_int32_or_unknown_are_kept(save_proto):
    huge = numpy_helper.from_array(np.array([0, 2**40], np.int64), "index")
    model, narrow = _narrowed(save_proto(_gather_model(huge), "huge.onnx"), min_bytes=0)
    assert not narrow.reports[0].narrowed and "outside int32" in narrow.reports[0].proof
    assert model.graph.initializers["index"].dtype == INT64
    model, narrow = _narrowed(save_proto(_gather_model(None, index_input=True), "input.onnx"), min_bytes=0)
    assert not narrow.reports[0].narrowed and "graph input 'index'" in narrow.reports[0].proof


def test_cast_goes_at_the_producer_for_argmax(save_proto, tmp_path):
    argmax = helper.make_node("ArgMax", ["x"], ["index"], name="argmax", axis=1, keepdims=0)
    source = save_proto(_gather_model(None, [argmax]), "argmax.onnx")
    model, narrow = _narrowed(source, min_bytes=0)
    [report] = narrow.reports
    assert report.narrowed and report.bounds == (0, 99) and report.casts_at_producers == ["argmax"]
    gather = next(n for n in model.graph if n.op_type == "Gather")
    cast = gather.inputs[1].producer()
    assert cast.op_type == "Cast" and cast.inputs[0].producer().op_type == "ArgMax"
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)


def test_unmodelled_constant_chain_is_evaluated_with_onnxruntime(save_proto, tmp_path):
    # MatMul has no bounds rule; its inputs are constants, so its min/max is measured once.
    a = numpy_helper.from_array(np.arange(8, dtype=np.int64).reshape(8, 1) % 5, "a")
    b = numpy_helper.from_array(np.array([[3]], np.int64), "b")
    matmul = helper.make_node("MatMul", ["a", "b"], ["index2d"], name="matmul")
    flat = helper.make_node("Reshape", ["index2d", "minus_one"], ["index"], name="flat")
    model_proto = _gather_model(None, [matmul, flat])
    model_proto.graph.initializer.extend([a, b, numpy_helper.from_array(np.array([-1], np.int64), "minus_one")])
    source = save_proto(model_proto, "matmul.onnx")
    model, narrow = _narrowed(source, min_bytes=0)
    [report] = narrow.reports
    assert report.narrowed and report.bounds == (0, 12)
    assert "evaluated once with onnxruntime" in report.proof and "index2d" in report.proof
    assert report.casts_at_producers == ["matmul"]
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)


def test_small_regions_are_left_alone(save_proto):
    small = numpy_helper.from_array(np.arange(8, dtype=np.int64), "index")
    model, narrow = _narrowed(save_proto(_gather_model(small), "small.onnx"))  # default min_bytes: 64 KB
    assert narrow.reports == [] and model.graph.initializers["index"].dtype == INT64


# -- every op a region passes through runs on int32 in onnxruntime and gives the same values --


def _i64(values, name):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _op_case(op: str, dtype: int):
    """(nodes, inputs as (name, array), initializers) for ``op`` with data in ``dtype``."""
    np_dtype = np.int32 if dtype == TensorProto.INT32 else np.int64
    x = np.arange(12, dtype=np_dtype).reshape(3, 4) + 1
    attrs, extra, inits = {}, [], []
    data = ["x"]
    meta = {
        "Reshape": [_i64([-1], "shape")],
        "Squeeze": [_i64([0], "axes")],
        "Unsqueeze": [_i64([0], "axes")],
        "Expand": [_i64([2, 3, 4], "shape")],
        "Tile": [_i64([2, 1], "reps")],
        "Slice": [_i64([0], "starts"), _i64([2], "ends")],
        "Gather": [_i64([2, 0], "idx")],
        "GatherElements": [_i64([[0, 1, 2, 0]], "idx")],
        "GatherND": [_i64([[1], [0]], "idx")],
        "Split": [_i64([1, 2], "split")],
        "Pad": [_i64([0, 1, 0, 1], "pads")],
        "CumSum": [_i64(1, "axis")],
        "ReduceSum": [_i64([1], "axes")],
    }.get(op, [])
    inits += meta
    names = data + [t.name for t in meta]
    if op == "Squeeze":
        x = x.reshape(1, 12)
    if op in ("Concat", "Add", "Sub", "Mul", "Div", "Mod", "Max", "Min"):
        extra = [("y", np.full((3, 4), 3, np_dtype))]
        names = ["x", "y"]
    if op == "Where":
        extra = [("c", np.array([[True, False, True, False]] * 3)), ("y", -x)]
        names = ["c", "x", "y"]
    if op == "ScatterElements":
        inits.append(_i64([[1, 0, 2, 1]], "idx"))
        extra = [("u", np.full((1, 4), 7, np_dtype))]
        names = ["x", "idx", "u"]
    if op == "ScatterND":
        inits.append(_i64([[1]], "idx"))
        extra = [("u", np.full((1, 4), 7, np_dtype))]
        names = ["x", "idx", "u"]
    if op == "Pad":
        extra = [("v", np.array(5, np_dtype))]
        names = ["x", "pads", "v"]
    if op == "Clip":
        extra = [("lo", np.array(2, np_dtype)), ("hi", np.array(9, np_dtype))]
        names = ["x", "lo", "hi"]
    if op == "Range":
        x = np.array(1, np_dtype)
        extra = [("y", np.array(9, np_dtype)), ("d", np.array(2, np_dtype))]
        names = ["x", "y", "d"]
    if op == "Neg" or op == "Abs":
        x = x - 6
    if op in ("Concat",):
        attrs["axis"] = 0
    if op == "Flatten":
        attrs["axis"] = 1
    if op in ("ReduceMax", "ReduceMin"):
        attrs["axes"] = [1]
    if op == "GatherElements":
        attrs["axis"] = 0
    outputs = ["out0", "out1"] if op == "Split" else ["out0"]
    node = helper.make_node(op, names, outputs, **attrs)
    feeds = [("x", x), *extra]
    return node, feeds, inits, outputs


@pytest.mark.parametrize("op", sorted(REGION_OPS))
def test_region_op_runs_on_int32(op):
    results = {}
    for dtype in (TensorProto.INT64, TensorProto.INT32):
        node, feeds, inits, outputs = _op_case(op, dtype)
        graph = helper.make_graph(
            [node],
            op,
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds],
            [helper.make_tensor_value_info(o, dtype, None) for o in outputs],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        results[dtype] = session.run(None, dict(feeds))
    for wide, narrow in zip(results[TensorProto.INT64], results[TensorProto.INT32]):
        assert narrow.dtype == np.int32
        np.testing.assert_array_equal(wide, narrow.astype(np.int64))


def test_an_unbounded_reader_downstream_does_not_spoil_the_grid(save_proto, tmp_path):
    """index -> GatherElements (narrowed) and index + offset (a graph input) -> output: Cast back there."""
    proto = hitnet_bloat(height=64, width=64, tile1=3, tile2=2)
    proto.graph.input.append(helper.make_tensor_value_info("offset", TensorProto.INT64, [1]))
    proto.graph.node.append(helper.make_node("Add", ["index", "offset"], ["shifted"], name="shift"))
    proto.graph.output.append(helper.make_tensor_value_info("shifted", TensorProto.INT64, None))
    source = save_proto(proto, "shifted.onnx")
    model, narrow = _narrowed(source)
    assert [r.narrowed for r in narrow.reports] == [True]
    shift = next(n for n in model.graph if n.op_type == "Add")
    assert shift.inputs[0].dtype == INT64 and shift.inputs[0].producer().op_type == "Cast"
    feeds = [
        {
            "cost": np.random.default_rng(0).standard_normal((1, 64, 64, 8)).astype(np.float32),
            "offset": np.array([2**40], np.int64),
        }
    ]
    assert_pass_preserves_outputs(source, model, tmp_path, feeds=feeds, atol=0, rtol=0)


def test_an_exclusive_cumsum_is_bounded_with_its_leading_zero():
    """Found by the property test (tests/properties): CumSum(exclusive=1) of 2..4 starts at 0,
    which its interval (2..16) left out; a proof must contain every value the op computes."""
    from onnxsmith.analysis.intervals import Bounds

    steps = np.array([[3, 4, 2, 4]], np.int64)
    graph = helper.make_graph(
        [helper.make_node("CumSum", ["steps", "axis"], ["offsets"], exclusive=1)],
        "cumsum",
        [],
        [helper.make_tensor_value_info("offsets", TensorProto.INT64, [1, 4])],
        [numpy_helper.from_array(steps, "steps"), numpy_helper.from_array(np.array(-1, np.int64), "axis")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model = ir.serde.deserialize_model(proto)
    infer_types(model)
    low, high = Bounds().of(model.graph.outputs[0])
    (computed,) = ort.InferenceSession(proto.SerializeToString()).run(None, {})
    assert computed.tolist() == [[0, 3, 7, 9]]
    assert low <= computed.min() and computed.max() <= high
