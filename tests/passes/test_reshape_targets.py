"""ConstantReshapeTargetsPass: computed Reshape targets become constants; outputs unchanged, empty cache included."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes.reshape_targets import ConstantReshapeTargetsPass
from tests.support.check import assert_pass_preserves_outputs
from tests.support.lm_models import assert_lm_pass_preserves_outputs, lm_folder


def _computed_targets(model) -> int:
    return sum(1 for n in model.graph if n.op_type == "Reshape" and const_array(n.inputs[1]) is None)


@pytest.mark.parametrize("which", ["gpt2", "gpt2_nopast", "glassllm"])
def test_shape_chains_become_constants(tmp_path, which):
    folder = lm_folder(which)
    source = folder / "onnx" / "model.onnx"
    model = load_model(source)
    infer_types(model)
    computed, nodes = _computed_targets(model), len(list(model.graph))
    targets = ConstantReshapeTargetsPass()(model)
    RemoveUnusedNodesPass()(model)
    assert targets.rewritten == computed - _computed_targets(model) > 0
    assert len(list(model.graph)) < nodes - 2 * targets.rewritten  # their Shape/Gather/Concat chains died
    for node in model.graph:
        target = const_array(node.inputs[1]) if node.op_type == "Reshape" else None
        if target is not None:
            assert list(target).count(-1) <= 1
    if which == "gpt2":  # the heads split: [batch, sequence, heads, head size] copies two dims
        assert any(
            list(const_array(n.inputs[1])) == [0, 0, -1, 16]
            for n in model.graph
            if n.op_type == "Reshape" and const_array(n.inputs[1]) is not None
        )
    # prefill from an empty cache (a 0-length past) and a step on top of it
    assert_lm_pass_preserves_outputs(source, model, tmp_path)


def _reshape_by_shape_of(other_dims, *, allowzero=0):
    """Reshape x [a, b, 8] to [Shape(other)[0], Shape(other)[1], 8]: equal to 0, 0 only if other's dims are x's."""
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
        (["b", "a", 5], 0, None),  # the dims are x's, swapped: not copies
        (["a", "c", 5], 0, None),  # an unrelated dim: no -1 is ever introduced for it
        (["a", "b", 5], 1, None),  # allowzero=1: 0 means an empty dim, not "copy"
        ([4, 5, 5], 0, [4, 5, 8]),  # static: plain integers
    ],
)
def test_a_target_is_replaced_only_when_every_element_is_known(tmp_path, save_proto, other_dims, allowzero, expected):
    source = save_proto(_reshape_by_shape_of(other_dims, allowzero=allowzero))
    model = load_model(source)
    infer_types(model)
    ConstantReshapeTargetsPass()(model)
    reshape = next(n for n in model.graph if n.op_type == "Reshape")
    target = const_array(reshape.inputs[1])
    assert (None if target is None else list(target)) == expected
    if expected is not None:
        rng = np.random.default_rng(0)
        feeds = [
            {
                "x": rng.standard_normal((4, 5, 8)).astype(np.float32),
                "other": rng.standard_normal((4, 5, 5)).astype(np.float32),
            }
        ]
        assert_pass_preserves_outputs(source, model, tmp_path, feeds=feeds)
