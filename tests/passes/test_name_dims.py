"""passes/name_dims.py: inferred dims named after the input dims they follow."""

import onnx_ir as ir

from onnxsmith.io.load import load_model
from onnxsmith.passes.fold_shapes import FoldShapesPass
from onnxsmith.passes.name_dims import NameDimsPass, name_input_dims
from onnxsmith.runtime.evaluate import evaluate_shapes
from tests.support.fusion import FACEAGE


def _dims(model):
    return [d for node in model.graph for out in node.outputs if out.shape is not None for d in out.shape]


def test_the_batch_keeps_its_name_through_reshapes_to_minus_one():
    model = load_model(FACEAGE["torchscript"])
    FoldShapesPass(evaluate_shapes(model, {"batch": 1}))(model)
    assert NameDimsPass({"batch": 1})(model).modified
    symbolic = [d for d in _dims(model) if not isinstance(d, int)]
    assert symbolic and all(d.value == "batch" for d in symbolic)
    activations = [
        out for node in model.graph for out in node.outputs if out.shape is not None and out.shape.rank() >= 3
    ]
    assert activations and all(out.shape[0] == ir.SymbolicDim("batch") for out in activations)


def test_unnamed_input_dims_get_names(save_proto):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, "?"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    assert name_input_dims(model) == ["x_dim0", "x_dim2"]
    NameDimsPass({"x_dim0": 2, "x_dim2": 5})(model)
    assert model.graph.outputs[0].shape == ir.Shape(["x_dim0", 3, "x_dim2"])
