"""passes/prune_rows.py: only the token rows the outputs read are computed."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes.prune_rows import PruneRowsPass
from onnxsmith.runtime.inputs import random_inputs
from tests.support.check import assert_pass_preserves_outputs

TOKENS, HIDDEN, HEADS = 6, 8, 2


def encoder_block(select, *, also_output_all: bool = False):
    """x[B,6,8] -> LN -> RoPE'd q,k / v -> MultiHeadAttention -> SkipLayerNorm -> BiasGelu MLP -> residual Add -> row(s).

    ``select``: an int (Gather on the tokens axis) or a (start, stop) Slice.
    """
    rng = np.random.default_rng(3)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    half = HIDDEN // HEADS // 2
    angles = rng.uniform(0, 3, (TOKENS, half))
    inits = [weight(n, HIDDEN, HIDDEN) for n in ("wq", "wk", "wv", "wo")] + [
        weight("w1", HIDDEN, 16),
        weight("w2", 16, HIDDEN),
        numpy_helper.from_array(np.ones(HIDDEN, np.float32), "g"),
        numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "bo"),
        numpy_helper.from_array(np.array(0, np.int64), "pos"),
        numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
        numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1),
        helper.make_node("MatMul", ["ln", "wq"], ["q"]),
        helper.make_node("MatMul", ["ln", "wk"], ["k"]),
        helper.make_node("MatMul", ["ln", "wv"], ["v"]),
        helper.make_node("RotaryEmbedding", ["q", "pos", "cos", "sin"], ["qr"], domain="com.microsoft"),
        helper.make_node("RotaryEmbedding", ["k", "pos", "cos", "sin"], ["kr"], domain="com.microsoft"),
        helper.make_node("MultiHeadAttention", ["qr", "kr", "v"], ["att"], domain="com.microsoft", num_heads=HEADS),
        helper.make_node("MatMul", ["att", "wo"], ["o"]),
        helper.make_node(
            "SkipLayerNormalization",
            ["o", "x", "g", "b", "bo"],
            ["n2", "", "", "sum"],
            domain="com.microsoft",
            epsilon=1e-5,
        ),
        helper.make_node("MatMul", ["n2", "w1"], ["h"]),
        helper.make_node("BiasGelu", ["h", "b1"], ["hg"], domain="com.microsoft"),
        helper.make_node("MatMul", ["hg", "w2"], ["m"]),
        helper.make_node("Add", ["m", "sum"], ["r"]),
    ]
    if isinstance(select, int):
        inits.append(numpy_helper.from_array(np.array(select, np.int64), "row"))
        nodes.append(helper.make_node("Gather", ["r", "row"], ["y"], axis=1))
        y_shape = ["batch", HIDDEN]
    else:
        for name, value in (("start", select[0]), ("stop", select[1]), ("axis", 1)):
            inits.append(numpy_helper.from_array(np.array([value], np.int64), name))
        nodes.append(helper.make_node("Slice", ["r", "start", "stop", "axis"], ["y"]))
        y_shape = ["batch", select[1] - select[0], HIDDEN]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)]
    if also_output_all:
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["batch", TOKENS, HIDDEN]))
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", TOKENS, HIDDEN])],
        outputs,
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def _prune(path):
    model = load_model(path)
    infer_types(model)
    prune = PruneRowsPass()(model)
    return model, prune, prune.modified


def _check_same(path, model, tmp_path):
    feeds = [random_inputs(model, dims={"batch": 2}, seed=s) for s in range(2)]
    assert_pass_preserves_outputs(path, model, tmp_path, feeds=feeds, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("row", [0, 3, -1])
def test_one_row_read_means_the_block_computes_one_row(row, save_proto, tmp_path):
    path = save_proto(encoder_block(row))
    model, prune, modified = _prune(path)
    assert modified
    narrowed = {node.outputs[0].name for node, _, _ in prune.pruned}
    start = row % TOKENS
    assert all(rows == (start, start + 1) and length == TOKENS for _, rows, length in prune.pruned)
    # Per-token work shrinks; keys and values (every row attends to all of them) do not.
    assert {"qr", "att", "o", "n2", "h", "hg", "m", "r"} <= narrowed and not {"ln", "k", "kr", "v"} & narrowed
    rotary_q = next(n for n in model.graph if n.outputs[0].name == "qr")
    assert int(const_array(rotary_q.inputs[1])) == start  # the rows keep their positions
    slices = [n for n in model.graph if n.op_type == "Slice"]
    assert {n.inputs[0].name for n in slices} == {"ln", "x"}  # q's input, and the residual into SkipLayerNorm
    _check_same(path, model, tmp_path)


def test_a_slice_of_rows(save_proto, tmp_path):
    path = save_proto(encoder_block((1, 3)))
    model, prune, modified = _prune(path)
    assert modified and {rows for _, rows, _ in prune.pruned} == {(1, 3)}
    _check_same(path, model, tmp_path)


def test_rows_read_in_full_elsewhere_are_kept(save_proto):
    """The residual output is also a graph output: every row of the block is needed."""
    _model, prune, modified = _prune(save_proto(encoder_block(0, also_output_all=True)))
    assert not modified and not prune.pruned


# Found by the property test (tests/properties/test_prune_rows_property.py); kept as they failed.


def _tokens_model(nodes, output_shape, inits):
    graph = helper.make_graph(
        nodes,
        "tokens",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _pruned(save_proto, proto, tmp_path):
    source = save_proto(proto, "tokens.onnx")
    model = load_model(source)
    infer_types(model)
    assert PruneRowsPass()(model).pruned
    assert_pass_preserves_outputs(source, model, tmp_path)  # writes and reloads it: a valid model
    return model


def test_two_readers_of_the_same_rows_share_one_slice(save_proto, tmp_path):
    """Both MatMuls read row 0 of x: one Slice for both (two used to write one name twice)."""
    rng = np.random.default_rng(0)
    proto = _tokens_model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"]),
            helper.make_node("MatMul", ["x", "w2"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Gather", ["s", "first"], ["y"], axis=1),
        ],
        [1, 2],
        {
            "w1": rng.standard_normal((4, 2)).astype(np.float32),
            "w2": rng.standard_normal((4, 2)).astype(np.float32),
            "first": np.array(0, np.int64),
        },
    )
    model = _pruned(save_proto, proto, tmp_path)
    assert [n.op_type for n in model.graph].count("Slice") == 1


@pytest.mark.parametrize(
    "select",
    [
        helper.make_node("Gather", ["s", "index"], ["y"], axis=-2),  # -3: row 0, counted from the end
        helper.make_node("Slice", ["s", "starts", "ends", "axes"], ["y"]),  # rows -3..-2: row 0
    ],
    ids=["gather", "slice"],
)
def test_a_selection_counting_from_the_end_is_rewritten_when_rows_start_at_0(save_proto, tmp_path, select):
    """Row 0 of 3 selected as -3: the pruned input holds one row, where -3 is out of range."""
    proto = _tokens_model(
        [helper.make_node("Mul", ["x", "half"], ["s"]), select],
        [1, 4] if select.op_type == "Gather" else [1, 1, 4],
        {
            "half": np.array(0.5, np.float32),
            "index": np.array(-3, np.int64),
            "starts": np.array([-3], np.int64),
            "ends": np.array([-2], np.int64),
            "axes": np.array([1], np.int64),
        },
    )
    _pruned(save_proto, proto, tmp_path)
