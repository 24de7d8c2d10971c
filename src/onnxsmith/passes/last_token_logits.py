"""Compute the logits of the last position only.

Generation reads one row of the logits per step: the last position's. A graph that
computes all of them runs the head — the biggest MatMul of a small LM, [hidden,
vocab] — once per prompt token during prefill, for nothing. This pass slices the
head's input to the last position (``Slice(-1:)`` on the sequence axis), so the
logits output becomes [batch, 1, vocab]; the rest of the graph (the KV cache it
returns included) is unchanged. Keep the full-logits graph for evaluation.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxsmith.core.errors import InputError
from onnxsmith.irutil.names import node_label
from onnxsmith.irutil.types import set_dtype

_INT64_MAX = np.iinfo(np.int64).max


class LastTokenLogitsPass(ir.passes.InPlacePass):
    """Slice the input of ``head`` (the MatMul computing ``logits``) to the last position."""

    def __init__(self, head: ir.Node, logits: ir.Value) -> None:
        super().__init__()
        self.head = head
        self.logits = logits

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        hidden = self.head.inputs[0]
        assert hidden is not None  # a MatMul reads its first operand
        shape = hidden.shape
        if shape is None or len(shape) < 3:
            raise InputError(
                f"cannot keep only the last position's logits: the input of the head '{node_label(self.head)}' "
                f"has {'unknown rank' if shape is None else f'rank {len(shape)}'}, not [batch, sequence, hidden]"
            )
        rank = len(shape)
        label = self.head.name or "lm_head"
        constants = []
        for suffix, value in (("starts", -1), ("ends", _INT64_MAX), ("axes", rank - 2)):
            tensor = ir.tensor(np.array([value], dtype=np.int64), name=f"{label}/last_position_{suffix}")
            constant = ir.Value(
                name=tensor.name, shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.INT64), const_value=tensor
            )
            graph.register_initializer(constant)
            constants.append(constant)
        sliced = ir.node("Slice", [hidden, *constants], name=f"{label}/last_position")
        last = sliced.outputs[0]
        set_dtype(last, hidden.dtype)
        last.shape = ir.Shape([*shape[: rank - 2], 1, shape[rank - 1]])
        graph.insert_before(self.head, sliced)
        self.head.replace_input_with(0, last)
        if self.logits.shape is not None and len(self.logits.shape) >= 2:
            dims = list(self.logits.shape)
            dims[-2] = 1
            self.logits.shape = ir.Shape(dims)
        # Values between the head and the output have the sequence axis too; their old dims are stale.
        later = self.head.outputs[0]
        while later is not self.logits and later.uses():
            later.shape = None
            later = next(iter(later.uses()))[0].outputs[0]
        return ir.passes.PassResult(model, modified=True)
