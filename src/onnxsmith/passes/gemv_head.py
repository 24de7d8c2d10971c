"""The LM head's weight gets a leading unit dim, so onnxruntime multiplies it by MLAS's GEMV.

onnxruntime prepacks every 2-D constant MatMul weight at load into MLAS's packed-B
layout. For many rows that is faster; for one row — every decode step, and the last-
token prefill — MLAS has a GEMV kernel (``MlasGemvFloatKernel``, on WASM and ARM64),
which the packed path bypasses. For a small LM the head is the biggest MatMul by far
(GPT-2's [768 or 256, 50,257]: half of a decode step), and onnxruntime-web runs it faster
as GEMV than prepacked (docs/quantize.md has the measurement). onnxruntime prepacks 2-D weights only (``GemmPackBFp32``), so the head's weight is stored
as [1, hidden, vocab]: MatMul broadcasts it over the batch, the arithmetic is the same,
and the runtime runs the GEMV. It also holds one fp32 copy of the head fewer (no packed
copy beside the table the lookups read).

Only the head: the body's small weights are faster prepacked (same measurement).

The weight may be a constant or a DequantizeLinear of constants (what passes/tied_head.py
writes): its stored tensors get the unit dim and its axis moves by one. Embedding lookups
that read the same weight (a tied table: ``Gather(axis=1)``) gather along the next axis
and drop the unit dim with a Squeeze. A weight that is the Transpose of such a constant
(a tied table stored in rows) gets an ``Unsqueeze``, which onnxruntime folds at load with
the Transpose. Anything else reading it leaves the model unchanged (``self._result.skipped`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames, node_label
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.irutil.types import set_dtype
from onnxsmith.irutil.walk import const_array


@dataclass
class GemvHeadResult(ir.passes.PassResult):
    """What :class:`GemvHeadPass` did, or why it did nothing."""

    skipped: str = ""  # why the model was left unchanged
    how: str = ""  # what was done


class GemvHeadPass(ir.passes.InPlacePass):
    """Store the weight of ``matmul`` (the LM head) as [1, hidden, vocab]; see the module doc."""

    def __init__(self, matmul: ir.Node) -> None:
        super().__init__()
        self.matmul = matmul

    def call(self, model: ir.Model) -> GemvHeadResult:
        self._result = GemvHeadResult(model, False)  # filled while the pass runs
        graph = model.graph
        self._result.skipped = self._why_not(model)
        if self._result.skipped:
            self._result.modified = False
            return self._result
        weight = self.matmul.inputs[1]
        assert weight is not None  # _why_not checked it
        producer = weight.producer()
        if producer is not None and producer.op_type == "Transpose":
            unsqueeze = ir.node("Unsqueeze", [weight, _unit_axis(graph, producer)], name=f"{producer.name}/unit_dim")
            graph.insert_after(producer, unsqueeze)
            self.matmul.replace_input_with(1, unsqueeze.outputs[0])
            unsqueeze.outputs[0].name = FreshNames(graph)(f"{weight.name}/unit_dim")
            set_dtype(unsqueeze.outputs[0], weight.dtype)
            if weight.shape is not None:
                unsqueeze.outputs[0].shape = ir.Shape([1, *weight.shape])
            source = producer.inputs[0]
            assert source is not None  # _why_not: it folds at load
            self._result.how = f"the head reads Unsqueeze(Transpose('{source.name}')), folded at load"
            self._result.modified = True
            return self._result
        if producer is None:
            _add_unit_dim(weight)
        else:  # DequantizeLinear(q, scale[, zero_point])
            blocked = producer.attributes.get_int("block_size", 0) > 0
            for i, stored in enumerate(producer.inputs):
                if stored is not None and (i == 0 or blocked):  # a per-axis scale stays 1-D
                    _add_unit_dim(stored)
            axis = producer.attributes.get_int("axis", 1)
            producer.attributes["axis"] = ir.AttrInt64("axis", axis % 2 + 1)
            weight.shape = ir.Shape([1, *weight.shape]) if weight.shape is not None else None
        lookups = [reader for reader, _ in list(weight.uses()) if reader is not self.matmul]
        for reader in lookups:
            _gather_then_squeeze(graph, reader)
        self._result.how = f"'{weight.name}' stored with a leading unit dim" + (
            f"; {len(lookups)} lookup(s) gather along the next axis" if lookups else ""
        )
        self._result.modified = True
        return self._result

    def _why_not(self, model: ir.Model) -> str:
        matmul, graph = self.matmul, model.graph
        x, weight = matmul.inputs[0], matmul.inputs[1]
        if x is None or x.shape is None or len(x.shape) < 3:
            return f"the input of '{node_label(matmul)}' is not known to be [batch, sequence, hidden]"
        if weight is None or weight.shape is None or len(weight.shape) != 2 or weight in graph.outputs:
            return f"'{node_label(matmul)}' does not read a 2-D weight"
        if model.opset_imports.get("", 1) < 13:
            return "opset < 13 (Squeeze with axes as an input)"
        producer = weight.producer()
        if producer is not None and producer.op_type == "Transpose" and producer.domain in ("", "ai.onnx"):
            if list(producer.attributes.get_ints("perm", [1, 0])) != [1, 0] or not _folds_at_load(producer.inputs[0]):
                return f"the head reads Transpose '{node_label(producer)}' of something computed at run time"
            if len(weight.uses()) != 1:
                return f"the head's weight '{weight.name}' is also read by something else"
            return ""
        stored: list[ir.Value | None] = [weight] if producer is None else list(producer.inputs)
        if producer is not None and (producer.op_type != "DequantizeLinear" or producer.domain not in ("", "ai.onnx")):
            return f"the head reads the output of {producer.op_type} '{node_label(producer)}', not a constant"
        for value in stored:
            if value is None:
                continue
            if const_array(value) is None or not value.is_initializer() or value in graph.inputs:
                return f"'{value.name}' is not an initializer"
            if producer is not None and any(user is not producer for user, _ in value.uses()):
                return f"'{value.name}' is also read by something else"
        for reader, index in weight.uses():
            if reader is matmul and index == 1:
                continue
            if reader.op_type != "Gather" or reader.domain not in ("", "ai.onnx") or index != 0:
                return f"the head's weight is also read by {reader.op_type} '{node_label(reader)}'"
        return ""


def _folds_at_load(value: ir.Value | None) -> bool:
    """An initializer, or a DequantizeLinear of initializers (folded with session.disable_quant_qdq=1)."""
    if value is None:
        return False
    producer = value.producer()
    if producer is None:
        return const_array(value) is not None
    return producer.op_type == "DequantizeLinear" and all(
        v is None or (v.producer() is None and const_array(v) is not None) for v in producer.inputs
    )


def _unit_axis(graph: ir.Graph, near: ir.Node) -> ir.Value:
    return add_initializer(graph, FreshNames(graph)(f"{near.name or 'weight'}/unit_axis"), np.array([0], np.int64))


def _add_unit_dim(value: ir.Value) -> None:
    tensor = value.const_value
    assert tensor is not None  # an initializer (_why_not)
    array = np.ascontiguousarray(const_array(value)[None])
    value.const_value = ir.Tensor(array, dtype=tensor.dtype, name=value.name)
    value.shape = ir.Shape(array.shape)


def _gather_then_squeeze(graph: ir.Graph, gather: ir.Node) -> None:
    """``Gather(w, ids, axis=a)`` of the 2-D weight == ``Squeeze(Gather(w3, ids, axis=a + 1), [0])``."""
    axis = gather.attributes.get_int("axis", 0) % 2
    gather.attributes["axis"] = ir.AttrInt64("axis", axis + 1)
    result = gather.outputs[0]
    squeeze = ir.node("Squeeze", [result, _unit_axis(graph, gather)], name=f"{gather.name or 'lookup'}/squeeze")
    graph.insert_after(gather, squeeze)
    squeezed = squeeze.outputs[0]
    result.replace_all_uses_with(squeezed, replace_graph_outputs=True)
    squeeze.replace_input_with(0, result)
    if result.name:  # the lookup's result keeps its name
        name = result.name
        result.name = FreshNames(graph)(f"{name}/unsqueezed")
        squeezed.name = name
    squeezed.shape, result.shape = result.shape, None
    if result.dtype is not None:
        squeezed.dtype = result.dtype
