"""analysis/fold_cost.py: the one rule every folding pass asks before storing a computed constant."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis.fold_cost import SMALL_FOLD, fold_cost, fold_refusal
from onnxsmith.io.load import load_model
from tests.support.models import int8_dequantised_mlp, shared_weight_read_through_copies


def _value(model: ir.Model, name: str) -> ir.Value:
    return next(out for node in model.graph for out in node.outputs if out.name == name)


def test_a_dequantised_int8_weight_would_grow_the_file(save_proto):
    model = load_model(save_proto(int8_dequantised_mlp(hidden=256)))
    weight = _value(model, "w")
    cost = fold_cost([weight], 256 * 256 * 4)
    # The Cast and the Mul die with their int8 weight and scale: 64 KB + 1 KB freed, 256 KB stored.
    assert (cost.stored, cost.freed, cost.read) == (262144, 65536 + 1024, 65536 + 1024)
    assert not cost.generated
    reason = fold_refusal(cost)
    assert reason.startswith("it would store 262144 bytes computed from 66560 bytes of constants")
    assert fold_refusal(cost, limit=cost.growth) is None  # asked for explicitly, it folds


def test_a_copy_of_a_shared_weight_would_store_it_twice(save_proto):
    model = load_model(save_proto(shared_weight_read_through_copies(hidden=256)))
    for name in ("w_again", "w_t"):
        cost = fold_cost([_value(model, name)], 256 * 256 * 4)
        assert (cost.freed, cost.read, cost.growth) == (0, 262144, 262144), name
        assert "second copy of constants other nodes read" in fold_refusal(cost)


def test_what_dies_with_the_fold_is_freed(save_proto):
    model = load_model(save_proto(shared_weight_read_through_copies(hidden=256)))
    # The Identity and the Transpose both replaced: only layer1 still reads w directly.
    cost = fold_cost([_value(model, "w_again"), _value(model, "w_t")], 2 * 256 * 256 * 4)
    assert cost.freed == 0
    layer1 = next(node for node in model.graph if node.name == "layer1")
    layer1.replace_input_with(1, model.graph.inputs[0])  # now nothing else reads w: it dies with them
    cost = fold_cost([_value(model, "w_again"), _value(model, "w_t")], 2 * 256 * 256 * 4)
    assert cost.freed == 262144 and cost.growth == 262144


def test_shape_arithmetic_and_small_tables_fold(save_proto):
    model = load_model(save_proto(int8_dequantised_mlp(hidden=256)))
    cost = fold_cost([_value(model, "target")], 16)
    assert cost.generated and cost.growth <= SMALL_FOLD and fold_refusal(cost) is None
    # A table made from a few bytes: within a generated-table limit, not within the plain one.
    big = fold_cost([_value(model, "target")], 64 * 1024)
    assert fold_refusal(big) is not None
    assert fold_refusal(big, generated_limit=1 << 20) is None


def test_a_constant_a_subgraph_also_reads_is_not_freed(save_proto):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["branch_y"])],
        "branch",
        [],
        [helper.make_tensor_value_info("branch_y", TensorProto.FLOAT, [2, 4])],
    )
    nodes = [
        helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0], name="transpose"),
        helper.make_node("MatMul", ["x", "w_t"], ["h"], name="matmul"),
        helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch, name="if"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
        ],
        [w],
    )
    model = load_model(save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    cost = fold_cost([_value(model, "w_t")], 64)
    assert (cost.read, cost.freed) == (64, 0)
