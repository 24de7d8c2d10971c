"""passes/fold_shapes.py: what the symbolic-shape engine proves constant is folded, the free dims stay free."""

import numpy as np
import pytest

from onnxsmith.io.load import load_model
from onnxsmith.io.save import save_model
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes.fold_shapes import FoldShapesPass, FoldShapesResult, constants_to_evaluate
from onnxsmith.probes.evaluate import evaluate_constants
from onnxsmith.runtime.inputs import random_inputs
from tests.support.check import assert_pass_preserves_outputs
from tests.support.fusion import FACEAGE, op_count
from tests.support.models import int8_dequantised_mlp, mlp, shared_weight_read_through_copies


def fold_shapes(model) -> FoldShapesResult:
    return FoldShapesPass(evaluate_constants(model, constants_to_evaluate(model)))(model)


SHAPE_OPS = ("Shape", "Size", "Expand", "ConstantOfShape", "Range", "Tile", "If", "Where", "Equal", "Unsqueeze")


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_no_shape_arithmetic_left_for_a_fixed_image_size(exporter, tmp_path):
    model = load_model(FACEAGE[exporter])
    fold = fold_shapes(model)
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
    fold_shapes(model)
    cos = next(n for n in model.graph if n.op_type == "Cos")  # Cos/Sin stay: the rotary rule wants the angles
    angles = const_array(cos.inputs[0])
    reference = next(n for n in load_model(FACEAGE["dynamo"]).graph if n.op_type == "Cos")
    assert angles.shape == (196, 64)
    np.testing.assert_allclose(angles, const_array(reference.inputs[0]), rtol=0, atol=1e-6)


def test_nothing_to_fold_leaves_the_graph_alone(save_proto):
    model = load_model(save_proto(mlp()))
    assert not fold_shapes(model).modified


def _pooled_graph(save_proto):
    """x[1, 1, h, w] -> two 4x4 max-pools -> flattened with a target computed from the pooled dims
    (floor(h/16) * floor(w/16)), plus a ConstantOfShape sized by the pooled height."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("MaxPool", ["x"], ["p1"], kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("MaxPool", ["p1"], ["p"], kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Shape", ["p"], ["s"]),
        helper.make_node("Gather", ["s", "two"], ["h"], axis=0),
        helper.make_node("Gather", ["s", "three"], ["w"], axis=0),
        helper.make_node("Mul", ["h", "w"], ["hw"]),
        helper.make_node("Unsqueeze", ["hw", "zero"], ["hw1"]),
        helper.make_node("Concat", ["one_one", "hw1"], ["target"], axis=0),
        helper.make_node("Reshape", ["p", "target"], ["flat"]),
        helper.make_node("Unsqueeze", ["h", "zero"], ["h1"]),
        helper.make_node(
            "ConstantOfShape", ["h1"], ["rows"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1])
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "pooled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "h", "w"])],
        [
            helper.make_tensor_value_info("flat", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, None),
        ],
        [
            onnx.numpy_helper.from_array(np.array(2, np.int64), "two"),
            onnx.numpy_helper.from_array(np.array(3, np.int64), "three"),
            onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
            onnx.numpy_helper.from_array(np.array([1, 1], np.int64), "one_one"),
        ],
    )
    return save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_sizes_derived_by_striding_stay_free(save_proto, tmp_path):
    """floor(h/16) is 1 at h = 16 and at h = 31: a size that was equal in two runs is not a constant (issue 11
    class 11). The engine knows it as an expression in h; only what is proven constant is folded."""
    from onnxsmith.analysis.symbolic_shapes import Kind, SymbolicShapes

    path = _pooled_graph(save_proto)
    model = load_model(path)
    shapes = SymbolicShapes(model.graph)
    pooled_height = next(n for n in model.graph if n.outputs[0].name == "h").outputs[0]
    fact = shapes.fact(pooled_height)
    assert fact.kind is Kind.EXPRESSION and fact.depends_on == {"h"}
    assert str(fact.elements[0]) == "floor(h/16)"
    fold = fold_shapes(model)
    assert fold.reshapes == 1 and fold.folded == 0
    reshape = next(n for n in model.graph if n.op_type == "Reshape")
    assert const_array(reshape.inputs[1]).tolist() == [1, 1, -1]
    assert op_count(model, "ConstantOfShape") == 1  # its size follows h: still computed
    save_model(model, tmp_path / "folded.onnx")
    feeds = [
        random_inputs(model, shapes={"x": shape}, seed=1) for shape in ((1, 1, 16, 16), (1, 1, 31, 64), (1, 1, 96, 48))
    ]
    for feed in feeds:
        assert_pass_preserves_outputs(path, tmp_path / "folded.onnx", tmp_path, feeds=[feed])


def test_what_onnxruntime_cannot_evaluate_stays_computed(save_proto):
    """A constant computed through an op onnxruntime does not have: the pass says so and folds the rest."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["rows"], axis=0),
        helper.make_node("Cast", ["rows"], ["rows_f"], to=TensorProto.FLOAT),
        helper.make_node("Twice", ["rows_f"], ["twice"], domain="x.custom"),
        helper.make_node("Cast", ["twice"], ["twice_i"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["twice_i", "zero_v"], ["twice_v"]),
        helper.make_node("Concat", ["twice_v", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
            onnx.numpy_helper.from_array(np.array([0], np.int64), "zero_v"),
            onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("x.custom", 1)])
    model = load_model(save_proto(proto))
    fold = fold_shapes(model)
    assert "onnxruntime cannot load" in fold.skipped
    assert op_count(model, "Twice") == 1 and op_count(model, "Shape") == 1


def _stored_bytes(model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def test_an_int8_weight_stays_int8_while_its_shapes_fold(save_proto, tmp_path):
    """The dequantised weight is static too, but storing it would take 4x its bytes (MiniLM int8 fuse: 2.4x)."""
    source = save_proto(int8_dequantised_mlp(hidden=256), "int8.onnx")
    model = load_model(source)
    fold = fold_shapes(model)
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
    fold_shapes(model)
    assert op_count(model, "Transpose") == 1  # a transposed copy would store it twice
    assert _stored_bytes(model) == 256 * 256 * 4
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)
