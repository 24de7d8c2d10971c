"""fp64 constants read only through a conversion to float32 are stored as float32, bit-identically."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.passes.narrow_fp64 import NarrowFp64ConstantsPass
from tests.support.check import assert_pass_preserves_outputs

# atol=0 asks for bit-identical outputs; compare's relative error then divides 0 by 0 where both are 0.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")


def _scaled(opset: int = 17) -> onnx.ModelProto:
    """y = x * Cast(scale64) + CastLike(bias64, x); z = x64 * shared64 (double math: must stay double)."""
    rng = np.random.default_rng(0)
    scale = numpy_helper.from_array(rng.standard_normal((4, 8)) / 3, "scale64")  # not exact in fp32
    bias = numpy_helper.from_array(np.array(np.pi), "unused")
    nodes = [
        helper.make_node("Cast", ["scale64"], ["scale"], to=TensorProto.FLOAT, name="cast_scale"),
        helper.make_node("Mul", ["x", "scale"], ["xs"], name="mul"),
        helper.make_node("Constant", [], ["bias64"], value=numpy_helper.from_array(np.array(1 / 7)), name="bias"),
        helper.make_node("CastLike", ["bias64", "x"], ["bias32"], name="castlike"),
        helper.make_node("Add", ["xs", "bias32"], ["y"], name="add"),
        helper.make_node("Cast", ["x"], ["x64"], to=TensorProto.DOUBLE, name="up"),
        helper.make_node("Mul", ["x64", "shared64"], ["z64"], name="mul64"),
        helper.make_node("Cast", ["shared64"], ["shared32"], to=TensorProto.FLOAT, name="cast_shared"),
        helper.make_node("Add", ["z64", "unused"], ["z"], name="add64"),
        helper.make_node("Mul", ["y", "shared32"], ["w"], name="mul_shared"),
    ]
    graph = helper.make_graph(
        nodes,
        "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
            helper.make_tensor_value_info("z", TensorProto.DOUBLE, [4, 8]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 8]),
        ],
        [scale, bias, numpy_helper.from_array(np.array(0.1), "shared64")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_double_constants_read_as_float_become_float(save_proto, tmp_path):
    source = save_proto(_scaled(), "scaled.onnx")
    model = load_model(source)
    narrow = NarrowFp64ConstantsPass()(model)
    assert narrow.modified
    assert sorted((c.name, c.nbytes_before, c.casts_removed) for c in narrow.narrowed) == [
        ("bias64", 8, 1),
        ("scale64", 4 * 8 * 8, 1),
    ]
    assert model.graph.initializers["scale64"].const_value.dtype == ir.DataType.FLOAT
    ops = [n.op_type for n in model.graph]
    assert "CastLike" not in ops and ops.count("Cast") == 2  # x -> double and the shared one stay
    # read by double math too: untouched
    assert model.graph.initializers["shared64"].const_value.dtype == ir.DataType.DOUBLE
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)


def test_nothing_to_do_is_no_change(save_proto):
    proto = _scaled()
    del proto.graph.node[:5]
    proto.graph.output.pop(0)
    proto.graph.node.append(helper.make_node("Identity", ["x"], ["y"]))
    proto.graph.output.insert(0, helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]))
    model = load_model(save_proto(proto, "plain.onnx"))
    assert not NarrowFp64ConstantsPass()(model).modified
