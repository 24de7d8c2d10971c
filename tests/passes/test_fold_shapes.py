"""passes/fold_shapes.py: shape arithmetic evaluated for fixed input sizes, the batch kept free."""

import numpy as np
import pytest

from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes.fold_shapes import FoldShapesPass
from onnxsmith.runtime.evaluate import evaluate_shapes
from onnxsmith.runtime.inputs import random_inputs
from tests.support.check import assert_pass_preserves_outputs
from tests.support.fusion import FACEAGE, op_count
from tests.support.models import int8_dequantised_mlp, mlp, shared_weight_read_through_copies

SHAPE_OPS = ("Shape", "Size", "Expand", "ConstantOfShape", "Range", "Tile", "If", "Where", "Equal", "Unsqueeze")


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_no_shape_arithmetic_left_for_a_fixed_image_size(exporter, tmp_path):
    model = load_model(FACEAGE[exporter])
    fold = FoldShapesPass(evaluate_shapes(model, {"batch": 1}))(model)
    assert fold.modified
    assert all(op_count(model, op) == 0 for op in SHAPE_OPS)
    # Every Reshape takes a constant target with -1 for the batch, and nothing else free.
    for node in model.graph:
        if node.op_type == "Reshape":
            target = const_array(node.inputs[1])
            assert target is not None and target[0] == -1 and (target[1:] > 0).all(), node.name
    # The CLS/register tokens are no longer Expand-ed to the batch size: Pad + Add of a table.
    assert fold.concats == 1 and op_count(model, "Pad") == 1
    # What is left of Concat and Gather moves activations (RoPE's rotate_half, the CLS row), not shapes.
    for node in model.graph:
        if node.op_type in ("Concat", "Gather"):
            assert node.outputs[0].dtype is None or node.outputs[0].dtype.is_floating_point()
    save_model(model, tmp_path / "folded.onnx")
    for batch in (1, 3):  # the batch stays dynamic
        feeds = [random_inputs(model, dims={"batch": batch}, seed=7)]
        assert_pass_preserves_outputs(
            FACEAGE[exporter], tmp_path / "folded.onnx", tmp_path, feeds=feeds, atol=5e-3, rtol=1e-3
        )


def test_torchscript_rope_angles_are_evaluated_for_224x224():
    """The TorchScript export builds the angle table from the input's H and W (Shape, Range, If, Tile)."""
    model = load_model(FACEAGE["torchscript"])
    FoldShapesPass(evaluate_shapes(model, {"batch": 1}))(model)
    cos = next(n for n in model.graph if n.op_type == "Cos")  # Cos/Sin stay: the rotary rule wants the angles
    angles = const_array(cos.inputs[0])
    reference = next(n for n in load_model(FACEAGE["dynamo"]).graph if n.op_type == "Cos")
    assert angles.shape == (196, 64)
    np.testing.assert_allclose(angles, const_array(reference.inputs[0]), rtol=0, atol=1e-6)


def test_nothing_to_fold_leaves_the_graph_alone(save_proto):
    model = load_model(save_proto(mlp()))
    assert not FoldShapesPass(evaluate_shapes(model, {"batch": 1}))(model).modified


def test_a_size_the_model_cannot_run_at_folds_nothing(save_proto):
    """A Reshape fixed at 4 columns fails when 'width' doubles: the pass says so and changes nothing."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Reshape", ["x", "fixed"], ["y"]),
        helper.make_node("Reshape", ["y", "s"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "width"])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, "width"])],
        [onnx.numpy_helper.from_array(np.array([4, 2], np.int64), "fixed")],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    fold = FoldShapesPass(evaluate_shapes(model, {"width": 4}))(model)
    assert not fold.modified
    assert "failed to run" in fold.skipped and op_count(model, "Shape") == 1


def _stored_bytes(model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def test_an_int8_weight_stays_int8_while_its_shapes_fold(save_proto, tmp_path):
    """The dequantised weight is static too, but storing it would take 4x its bytes (MiniLM int8 fuse: 2.4x)."""
    source = save_proto(int8_dequantised_mlp(hidden=256), "int8.onnx")
    model = load_model(source)
    fold = FoldShapesPass(evaluate_shapes(model, {"batch": 1}))(model)
    assert fold.reshapes == 1 and op_count(model, "Shape") == 0  # the Reshape target is [-1, 256]
    assert op_count(model, "Cast") == 1 and op_count(model, "Mul") == 1  # dequantised at run time
    assert _stored_bytes(model) < 70_000
    for batch in (1, 5):
        feeds = [random_inputs(model, dims={"batch": batch}, seed=3)]
        assert_pass_preserves_outputs(source, model, tmp_path, feeds=feeds, atol=0, rtol=0)


def test_a_shared_weight_is_read_not_copied(save_proto, tmp_path):
    """rxnmap reads each shared block through an Identity per reuse: fold_shapes stored a copy (fuse 1.10x)."""
    source = save_proto(shared_weight_read_through_copies(hidden=256), "shared.onnx")
    model = load_model(source)
    FoldShapesPass(evaluate_shapes(model, {"batch": 1}))(model)
    layer2 = next(node for node in model.graph if node.name == "layer2")
    assert layer2.inputs[1].name == "w"  # the Identity's reader reads the weight itself
    assert op_count(model, "Transpose") == 1  # a transposed copy would store it twice
    assert _stored_bytes(model) == 256 * 256 * 4
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)
