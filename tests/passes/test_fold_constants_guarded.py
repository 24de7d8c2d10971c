"""Guarded constant folding: small constant chains fold, a big computed grid stays computed."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.passes.fold_constants_guarded import FoldConstantsGuardedPass
from tests.support.check import assert_pass_preserves_outputs
from tests.support.models import int8_dequantised_mlp, shared_weight_read_through_copies
from tests.support.surgery_models import hitnet_bloat

# atol=0 asks for bit-identical outputs; compare's relative error then divides 0 by 0 where both are 0.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")


def _ops(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


def _stored_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def test_big_grid_stays_computed_small_chain_folds(save_proto, tmp_path):
    # Expand makes 128*256*8 int64 = 2 MB, over the 4 KB default; Range and Reshape before it are tiny.
    source = save_proto(hitnet_bloat(height=128, width=256, tile1=3, tile2=2), "grid.onnx")
    model = load_model(source)
    fold = FoldConstantsGuardedPass()(model)
    assert fold.modified
    assert "Range" not in _ops(model) and "Reshape" not in _ops(model)  # folded: they were tiny
    assert _ops(model).count("Tile") == 2 and "Expand" in _ops(model)  # the grid is computed at run time
    [refused] = fold.refused
    assert (refused.node, refused.op_type, refused.output_bytes) == ("expand", "Expand", 128 * 256 * 8 * 8)
    assert "stays computed" in refused.reason
    assert _stored_bytes(model) < 1024
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)


def test_the_guard_is_what_stops_it(save_proto, tmp_path):
    source = save_proto(hitnet_bloat(height=128, width=256, tile1=3, tile2=2), "grid.onnx")
    model = load_model(source)
    fold = FoldConstantsGuardedPass(max_growth=64 * 2**20)(model)
    assert fold.refused == []
    # Everything folded: the 12 MB int64 index grid is now stored.
    grid = 128 * 256 * 8 * 3 * 2 * 8
    assert _stored_bytes(model) >= grid
    assert "Tile" not in _ops(model)
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)


def _nonzero_and_big_input() -> onnx.ModelProto:
    """NonZero of a constant (output size unknown until evaluated) and a Transpose of a 64 KB constant."""
    mask = numpy_helper.from_array(np.array([[1, 0, 1], [0, 1, 0]], np.int64), "mask")
    table = numpy_helper.from_array(np.arange(128 * 128, dtype=np.float32).reshape(128, 128), "table")
    nodes = [
        helper.make_node("NonZero", ["mask"], ["where"], name="nonzero"),
        helper.make_node("Transpose", ["table"], ["table_t"], name="transpose"),
        helper.make_node("MatMul", ["x", "table_t"], ["y"], name="matmul"),
    ]
    graph = helper.make_graph(
        nodes,
        "unknowns",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 128]),
            helper.make_tensor_value_info("where", TensorProto.INT64, [2, None]),
        ],
        [mask, table],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unknown_size_and_big_inputs_are_not_evaluated(save_proto, tmp_path):
    source = save_proto(_nonzero_and_big_input(), "unknowns.onnx")
    model = load_model(source)
    fold = FoldConstantsGuardedPass(max_input_bytes=1024)(model)
    reasons = {r.node: r.reason for r in fold.refused}
    assert "unknown before evaluating" in reasons["nonzero"]
    assert "not evaluated in memory" in reasons["transpose"]
    assert _ops(model) == ["NonZero", "Transpose", "MatMul"]
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)
    # With room to evaluate, the Transpose folds (it grows nothing: its input dies with it).
    model = load_model(source)
    FoldConstantsGuardedPass()(model)
    assert "Transpose" not in _ops(model)
    assert_pass_preserves_outputs(source, model, tmp_path)


def test_an_int8_weight_stays_int8(save_proto, tmp_path):
    """Cast(int8) -> Mul(scale) would store the weight in fp32: four times its bytes (MiniLM int8 shrink 1.5x)."""
    source = save_proto(int8_dequantised_mlp(hidden=256), "int8.onnx")
    model = load_model(source)
    fold = FoldConstantsGuardedPass()(model)
    assert _ops(model)[:2] == ["Cast", "Mul"]  # the dequantisation stays computed at run time
    assert model.graph.initializers["w_q"].const_value.dtype == ir.DataType.INT8
    [refused] = [r for r in fold.refused if r.node == "w_cast"]
    assert "computed from 65536 bytes of constants" in refused.reason and refused.growth == 3 * 65536
    assert _stored_bytes(model) < 70_000
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)
    # Asked to (an explicit limit), it folds to fp32.
    model = load_model(source)
    FoldConstantsGuardedPass(max_growth=1 << 20)(model)
    assert "Cast" not in _ops(model) and _stored_bytes(model) > 256 * 256 * 4
    assert_pass_preserves_outputs(source, model, tmp_path)


def test_a_shared_weight_is_not_copied(save_proto, tmp_path):
    """An Identity or Transpose of a weight other layers also read would store it twice (rxnmap's shared blocks)."""
    source = save_proto(shared_weight_read_through_copies(hidden=256), "shared.onnx")
    model = load_model(source)
    fold = FoldConstantsGuardedPass()(model)
    # onnxscript's folding reads the weight itself for the Identity; the Transpose stays computed.
    assert _ops(model) == ["MatMul", "MatMul", "Transpose", "MatMul"]
    assert [r.op_type for r in fold.refused if "second copy" in r.reason] == ["Transpose"]
    assert _stored_bytes(model) == 256 * 256 * 4
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)
    # Asked for room (an explicit limit), the copies are stored.
    model = load_model(source)
    FoldConstantsGuardedPass(max_growth=1 << 20)(model)
    assert _ops(model) == ["MatMul"] * 3 and _stored_bytes(model) == 2 * 256 * 256 * 4


def test_a_weight_stored_fp16_and_widened_where_read_in_fp32_stays_so(save_proto, tmp_path):
    # fp16's weights of nodes computing in fp32: Cast(fp16 weight) -> fp32. Folded, each would store the weight
    # fp32 again (+1 KB here, well within the 4 KB limit, yet the file only grows): it stays a Cast.
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "widened",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 256])],
        [numpy_helper.from_array(rng.standard_normal(256).astype(np.float16), "w16")],
    )
    source = save_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model = load_model(source)
    fold = FoldConstantsGuardedPass()(model)
    assert _ops(model) == ["Cast", "Mul"] and _stored_bytes(model) == 512
    [refused] = fold.refused
    assert "(FLOAT16 -> FLOAT); it stays a Cast" in refused.reason
    assert_pass_preserves_outputs(source, model, tmp_path, atol=0, rtol=0)
