"""passes/lower_to_opset.py: Shape(start, end), written by onnxscript's fusions, in an opset-14 model."""

import onnx
from onnx import TensorProto, helper

from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from onnxsmith.passes.lower_to_opset import LowerToOpsetPass
from tests.support.check import assert_pass_preserves_outputs
from tests.support.fusion import op_count


def _model(opset: int) -> onnx.ModelProto:
    """x[batch, seq, 8] -> Reshape to [batch, seq, 2, 4] with seq taken by Shape(x, start=1, end=2)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["batch"], start=0, end=1),
        helper.make_node("Shape", ["x"], ["seq"], start=1, end=2),
        helper.make_node("Shape", ["x"], ["last"], start=-1),
        helper.make_node("Concat", ["batch", "seq", "heads", "last_over_heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Cast", ["last"], ["width"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "shape_ranges",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("width", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor("heads", TensorProto.INT64, [1], [2]),
            helper.make_tensor("last_over_heads", TensorProto.INT64, [1], [4]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_shape_ranges_become_shape_and_slice_below_opset_15(tmp_path, save_proto):
    reference = save_proto(_model(15), "opset15.onnx")  # what the nodes mean, where they exist
    model = load_model(save_proto(_model(15), "opset14.onnx"))
    model.opset_imports[""] = 14
    result = LowerToOpsetPass()(model)
    assert result.lowered == 3
    assert op_count(model, "Slice") == 3
    assert all("start" not in n.attributes and "end" not in n.attributes for n in model.graph if n.op_type == "Shape")
    save_model(model, tmp_path / "lowered.onnx")
    onnx.checker.check_model(str(tmp_path / "lowered.onnx"), full_check=True)
    assert_pass_preserves_outputs(reference, tmp_path / "lowered.onnx", tmp_path, dims={"batch": 2, "seq": 3})


def test_a_model_at_opset_15_keeps_its_shape_ranges(save_proto):
    model = load_model(save_proto(_model(15)))
    assert not LowerToOpsetPass()(model).modified
