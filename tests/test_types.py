"""irutil/types.py: ensure_types infers only when a value that is read has no dtype."""

from __future__ import annotations

import onnx_ir as ir

from onnxsmith.irutil.types import ensure_types
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
