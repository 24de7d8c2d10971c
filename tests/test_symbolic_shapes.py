"""analysis/symbolic_shapes.py: what the shape arithmetic of real exports computes, and only what is certain."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper

from onnxsmith.analysis.symbolic_shapes import SymbolicShapes, named_dim, same
from onnxsmith.io.load import load_model
from onnxsmith.irutil.types import infer_types
from tests.support.lm_models import lm_folder


def _unknowns(dims) -> set[str]:
    return {str(s) for d in dims if isinstance(d, sympy.Expr) for s in d.free_symbols if str(s).startswith("_unknown")}


@pytest.mark.parametrize("which", ["gpt2", "gpt2_nopast", "glassllm"])
def test_every_dim_of_the_exports_is_known_in_their_input_dims(which):
    folder = lm_folder(which)
    model = load_model(folder / "onnx" / "model.onnx")
    infer_types(model)
    shapes = SymbolicShapes(model.graph)
    unknown = {
        node.name: _unknowns(shapes.dims(out))
        for node in model.graph
        for out in node.outputs
        if shapes.dims(out) is not None and _unknowns(shapes.dims(out))
    }
    assert not unknown
    reshapes = [n for n in model.graph if n.op_type == "Reshape"]
    assert reshapes and all(shapes.shape_value(n.inputs[1]) is not None for n in reshapes)
    if which == "gpt2":
        batch, seq, past = (
            sympy.Symbol(n, integer=True, nonnegative=True)
            for n in ("batch_size", "sequence_length", "past_sequence_length")
        )
        present = next(o for o in model.graph.outputs if o.name == "present.0.key")
        assert shapes.dims(present) == (batch, 4, past + seq, 16)  # Concat(past, new) along the sequence
        split_heads = [shapes.shape_value(n.inputs[1]) for n in reshapes if "attn/Reshape" in n.name]
        assert (batch, seq, -1, 16) in split_heads


def _graph(nodes, inputs, inits=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in inputs],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits],
    )
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    infer_types(model)
    return model, SymbolicShapes(model.graph)


def _out(model, name):
    return next(o for n in model.graph for o in n.outputs if o.name == name)


def test_broadcasting_is_only_resolved_when_certain():
    a, b = named_dim("a"), named_dim("b")
    model, shapes = _graph(
        [
            helper.make_node("Add", ["x", "y"], ["xy"]),
            helper.make_node("Add", ["x", "one"], ["x1"]),
            helper.make_node("Relu", ["x1"], ["r"]),
        ],
        [("x", ["a", 4]), ("y", ["b", 4]), ("one", [1, 4])],
    )
    unrelated = shapes.dims(_out(model, "xy"))[0]
    assert not same(unrelated, a) and not same(unrelated, b)  # a == b or one of them is 1: unknown which
    assert shapes.dims(_out(model, "x1")) == (a, 4)


def test_a_slice_to_the_sequence_length_broadcasts_to_it():
    """RoPE tables: Slice(cos[128, 16], 0, seq) is Min(128, seq) rows, and broadcasting it against seq gives seq."""
    seq = named_dim("seq")
    model, shapes = _graph(
        [
            helper.make_node("Shape", ["x"], ["sx"]),
            helper.make_node("Gather", ["sx", "one_i"], ["s"], axis=0),
            helper.make_node("Unsqueeze", ["s", "zero_v"], ["s1"]),
            helper.make_node("Slice", ["cos", "zero_v", "s1", "zero_v"], ["c"]),
            helper.make_node("Mul", ["x", "c"], ["y"]),
        ],
        [("x", ["b", "seq", 16])],
        [
            ("cos", np.ones((128, 16), np.float32)),
            ("one_i", np.array(1, np.int64)),
            ("zero_v", np.array([0], np.int64)),
        ],
    )
    assert shapes.dims(_out(model, "c")) == (sympy.Min(128, seq), 16)
    assert shapes.dims(_out(model, "y")) == (named_dim("b"), seq, 16)


def test_reshape_minus_one_is_inferred_from_the_input():
    model, shapes = _graph(
        [helper.make_node("Reshape", ["x", "flat"], ["f"]), helper.make_node("Reshape", ["x", "same"], ["g"])],
        [("x", ["a", "b", 8])],
        [("flat", np.array([-1, 8], np.int64)), ("same", np.array([0, -1, 8], np.int64))],
    )
    a, b = named_dim("a"), named_dim("b")
    assert same(shapes.dims(_out(model, "f"))[0], a * b) and shapes.dims(_out(model, "f"))[1] == 8
    assert shapes.dims(_out(model, "g")) == (a, b, 8)  # the other dims copy the input's: -1 is the input's too


def test_named_dims_are_parsed_without_eval():
    p, s = named_dim("past_sequence_length"), named_dim("sequence_length")
    assert same(named_dim("past_sequence_length + sequence_length"), p + s)
    assert same(named_dim("past_sequence_length + 1"), p + 1)
    assert str(named_dim("__import__('os').system('x')")) == "__import__('os').system('x')"  # one opaque dim
