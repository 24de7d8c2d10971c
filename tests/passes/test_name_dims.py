"""passes/name_dims.py: inferred dims named after the input dims they follow."""

import onnx_ir as ir

from onnxsmith.io.load import load_model
from onnxsmith.passes.fold_shapes import FoldShapesPass, constants_to_evaluate
from onnxsmith.passes.name_dims import NameDimsPass, name_input_dims
from onnxsmith.probes.evaluate import evaluate_constants
from tests.support.fusion import FACEAGE


def _dims(model):
    return [d for node in model.graph for out in node.outputs if out.shape is not None for d in out.shape]


def test_the_batch_keeps_its_name_through_reshapes_to_minus_one():
    model = load_model(FACEAGE["torchscript"])
    FoldShapesPass(evaluate_constants(model, constants_to_evaluate(model)))(model)
    assert NameDimsPass()(model).modified
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
    NameDimsPass()(model)
    assert model.graph.outputs[0].shape == ir.Shape(["x_dim0", 3, "x_dim2"])


def test_a_strided_size_is_an_expression_not_the_size_seen(save_proto):
    """floor(h/4) is 1 at h = 4 and at h = 7; declared as 1, onnxruntime would trust it at h = 64 (issue 11 class 11)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[4, 4], strides=[4, 4]),
            helper.make_node("Relu", ["p"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "h", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    assert NameDimsPass()(model).modified
    pooled = model.graph.node(0).outputs[0].shape
    assert pooled[:2] == ir.Shape([1, 1]) and pooled[3] == 2
    assert isinstance(pooled[2], ir.SymbolicDim) and pooled[2].value == "floor(h/4)"
    assert model.graph.outputs[0].shape == pooled
