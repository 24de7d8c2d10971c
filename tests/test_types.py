"""irutil/types.py: ensure_types infers only when a value that is read has no dtype."""

from __future__ import annotations

import onnx_ir as ir

from onnxsmith.irutil.types import ensure_types, forget_inferred_types, infer_types, typed_values
from tests.support.models import mlp


def _model() -> ir.Model:
    return ir.serde.deserialize_model(mlp())


def _untyped(model: ir.Model) -> list[ir.Value]:
    return [out for node in model.graph for out in node.outputs if out.dtype is None]


def test_an_untyped_value_gets_its_dtype():
    model = _model()
    for node in model.graph:
        for out in node.outputs:
            out.type = None
    assert _untyped(model)
    ensure_types(model)
    assert not _untyped(model)
    assert all(out.dtype == ir.DataType.FLOAT for node in model.graph for out in node.outputs)


def test_a_typed_model_is_left_as_it_is():
    model = _model()
    ensure_types(model)
    first = next(iter(model.graph)).outputs[0]
    first.shape = None  # inference would give it back; ensure_types must not run it
    assert not _untyped(model)
    ensure_types(model)
    assert first.shape is None


def test_inferred_types_are_forgotten_stated_ones_kept():
    model = _model()  # mlp() states no inner type: h0 .. y0 are all inferred
    h0 = next(iter(model.graph)).outputs[0]
    h0.dtype = ir.DataType.FLOAT
    stated = typed_values(model)
    assert stated == {h0}
    infer_types(model)
    inner = [out for node in model.graph for out in node.outputs if not out.is_graph_output()]
    assert all(out.shape is not None for out in inner)
    assert forget_inferred_types(model, stated) == len(inner) - 1
    assert [out for out in inner if out.type is not None] == [h0]
    assert model.graph.outputs[0].shape is not None  # the graph's outputs keep what they state


def test_types_past_an_operator_inference_does_not_know_are_kept():
    model = _model()
    mm2 = next(node for node in model.graph if node.name == "mm2")
    mm2.domain, mm2.op_type = "com.microsoft", "FusedMatMul"
    model.opset_imports["com.microsoft"] = 1
    infer_types(model)
    forget_inferred_types(model, set())
    assert mm2.outputs[0].dtype == ir.DataType.FLOAT  # onnx's inference could not find it again
