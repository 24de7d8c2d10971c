"""passes/fold_shapes.py on decoders: the shape chains of real exports become constants; outputs unchanged from an
empty cache; a -1 is never put beside a copied past length."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxsmith.analysis.symbolic_shapes import SymbolicShapes
from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes.fold_shapes import FoldShapesPass, constants_to_evaluate
from onnxsmith.probes.evaluate import evaluate_constants
from tests.support.check import assert_pass_preserves_outputs, save_ir
from tests.support.lm_models import assert_lm_pass_preserves_outputs, lm_folder


def _fold(model):
    return FoldShapesPass(evaluate_constants(model, constants_to_evaluate(model)))(model)


def _computed(model, op: str) -> int:
    return sum(1 for n in model.graph if n.op_type == op and const_array(n.inputs[1]) is None)


@pytest.mark.parametrize("which", ["gpt2", "gpt2_nopast", "glassllm", "llama"])
def test_shape_chains_become_constants(tmp_path, which):
    source = lm_folder(which) / "onnx" / "model.onnx"
    model = load_model(source)
    infer_types(model)
    reshapes, expands, nodes = _computed(model, "Reshape"), _computed(model, "Expand"), len(list(model.graph))
    fold = _fold(model)
    RemoveUnusedNodesPass()(model)
    # a target made constant as a whole counts as folded, one with a copied or inferred dim as a Reshape target
    assert fold.reshapes > 0 and _computed(model, "Reshape") <= reshapes - fold.reshapes
    assert _computed(model, "Expand") <= expands - fold.expands
    assert len(list(model.graph)) < nodes - 2 * fold.reshapes  # their Shape/Gather/Concat chains died
    for node in model.graph:
        target = const_array(node.inputs[1]) if node.op_type == "Reshape" else None
        if target is not None:
            assert list(target).count(-1) <= 1
    targets = [
        list(const_array(n.inputs[1]))
        for n in model.graph
        if n.op_type in ("Reshape", "Expand") and const_array(n.inputs[1]) is not None
    ]
    if which == "gpt2":  # the heads split: [batch, sequence, heads, head size] copies two dims
        assert [0, 0, 4, 16] in targets
    if which == "llama":
        # grouped-query attention repeats 2 key/value heads twice: through Shape/Gather/Concat/Where per layer in
        # the export, a constant that keeps every dim but the repeat now; the heads merged after it take a -1
        assert expands == fold.expands > 0 and _computed(model, "Expand") == 0
        assert targets.count([1, 1, 2, 1, 1]) == 4
        assert [0, 4, -1, 16] in targets
    # prefill from an empty cache (a 0-length past) and a step on top of it
    assert_lm_pass_preserves_outputs(source, model, tmp_path)


def _reshape_by_shape_of(other_dims, *, allowzero=0):
    """Reshape x [a, b, 8] to [Shape(other)[0], Shape(other)[1], 8]."""
    nodes = [
        helper.make_node("Shape", ["other"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "two"], ["ab"]),
        helper.make_node("Concat", ["ab", "eight"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], allowzero=allowzero),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", 8]),
            helper.make_tensor_value_info("other", TensorProto.FLOAT, other_dims),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
            numpy_helper.from_array(np.array([8], np.int64), "eight"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "other_dims, allowzero, expected",
    [
        (["a", "b", 5], 0, [0, 0, 8]),
        (["b", "a", 5], 0, None),  # the dims are x's, swapped: neither a copy, and two free
        (["a", "c", 5], 0, [0, -1, 8]),  # c must be b for x to fit: the one left free is -1
        (["a", "b", 5], 1, [0, 0, 8]),  # allowzero=1 copying a's own 0 is the same as copying it
        ([4, 5, 5], 0, [4, 5, 8]),  # static: plain integers
    ],
)
def test_a_target_is_replaced_only_when_every_element_is_known(tmp_path, save_proto, other_dims, allowzero, expected):
    source = save_proto(_reshape_by_shape_of(other_dims, allowzero=allowzero))
    model = load_model(source)
    infer_types(model)
    _fold(model)
    reshape = next(n for n in model.graph if n.op_type == "Reshape")
    target = const_array(reshape.inputs[1])
    assert (None if target is None else list(target)) == expected
    if expected is not None:
        rng = np.random.default_rng(0)
        feeds = {"x": rng.standard_normal((4, 5, 8)).astype(np.float32)}
        feeds["other"] = rng.standard_normal((4, 5, 5)).astype(np.float32)
        assert_pass_preserves_outputs(source, model, tmp_path, feeds=[feeds])
        if -1 in expected or other_dims[0] != "a":  # a -1 beside an empty batch cannot be inferred (only a past
            return  # length is taken to be 0 at run time); a static batch cannot be empty
        empty = {"x": np.zeros((0, 5, 8), np.float32), "other": np.zeros((0, 5, 5), np.float32)}
        assert _shapes(source, empty) == _shapes(save_ir(model, tmp_path / "after.onnx"), empty) == [(0, 5, 8)]


def _shapes(path, feeds) -> list[tuple[int, ...]]:
    """The output shapes onnxruntime gives (an empty tensor's comparison proves nothing; its shape does)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [tuple(out.shape) for out in session.run(None, feeds)]


def _past_heads_merged():
    """A KV cache [batch, 2, past, 4] reshaped to [2 * batch, 1, past, 4] by a computed target: the batch becomes
    the one -1 only if the copied past length is never 0, and it is 0 before the first token."""
    nodes = [
        helper.make_node("Shape", ["past_key_values.0.key"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"]),
        helper.make_node("Mul", ["b", "two"], ["b2"]),
        helper.make_node("Gather", ["s", "i2"], ["p"]),
        helper.make_node("Concat", ["b2", "one", "p", "four"], ["target"], axis=0),
        helper.make_node("Reshape", ["past_key_values.0.key", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["batch", 2, "past", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array([0], np.int64), "i0"),
            numpy_helper.from_array(np.array([2], np.int64), "i2"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([4], np.int64), "four"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_no_minus_one_beside_a_past_length_that_may_be_empty(tmp_path, save_proto):
    source = save_proto(_past_heads_merged())
    model = load_model(source)
    infer_types(model)
    _fold(model)
    reshape = next(n for n in model.graph if n.op_type == "Reshape")
    assert const_array(reshape.inputs[1]) is None  # [-1, 1, 0, 4] would fail on an empty cache
    empty = {"past_key_values.0.key": np.zeros((3, 2, 0, 4), np.float32)}
    assert _shapes(save_ir(model, tmp_path / "after.onnx"), empty) == [(6, 1, 0, 4)]


def test_a_constant_boolean_condition_selects_shape_values():
    """TorchScript's expand writes Where(Equal(shape, -1), ones, shape); once a fold made the Equal a constant,
    the Where still selects known elements."""
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Where", ["keep", "ones", "s"], ["target"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "past"])],
        [helper.make_tensor_value_info("target", TensorProto.INT64, [3])],
        [
            numpy_helper.from_array(np.array([False, True, False]), "keep"),
            numpy_helper.from_array(np.array([1, 1, 1], np.int64), "ones"),
        ],
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    shapes = SymbolicShapes(model.graph)
    assert [str(d) for d in shapes.shape_value(model.graph.outputs[0])] == ["batch", "1", "past"]
