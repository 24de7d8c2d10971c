"""Deliberately broken variants: what the one gate (onnxsmith/verify/gate.py) must refuse in every command.

Each edits one weight of a model (an onnx.ModelProto, or an onnx-ir model for a test-only
transform) as a faulty conversion could: a layer's sign flipped, a bias shifted, a weight so
large that its layer overflows to inf (and the next one to NaN).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import numpy_helper

#: name -> what it does to a weight array.
DEFECTS = {
    "flipped sign": lambda w: -w,
    "shifted bias": lambda w: w + np.abs(w).max() + 1,
    "overflow": lambda w: w * np.asarray(1e38 if w.dtype == np.float32 else 6e4, w.dtype),
}


def broken_proto(model: onnx.ModelProto, defect: str, weight: str) -> onnx.ModelProto:
    """A copy of ``model`` with ``defect`` applied to the initializer ``weight``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    tensor = next(t for t in copy.graph.initializer if t.name == weight)
    tensor.CopyFrom(numpy_helper.from_array(_apply(defect, numpy_helper.to_array(tensor)), weight))
    return copy


def break_ir(model: ir.Model, defect: str, weight: str) -> None:
    """Apply ``defect`` to the initializer ``weight`` of an onnx-ir model, in place."""
    value = model.graph.initializers[weight]
    value.const_value = ir.tensor(_apply(defect, value.const_value.numpy()), name=weight)


def _apply(defect: str, array: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return DEFECTS[defect](array.copy()).astype(array.dtype)
