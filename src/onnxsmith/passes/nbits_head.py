"""The LM head as one 8-bit com.microsoft MatMulNBits, for runtimes that run it (native CPU, WebGPU).

Why not a DequantizeLinear: where onnxruntime does not fold it at load (native CPU, whose
``session.disable_quant_qdq`` is off), a DequantizeLinear the head shares with the embedding
lookups is run again on every call. The whole [hidden, vocab] table is dequantized to read one
token (for SmolLM2's [576, 49152] head, several times a whole decode step), and the per-token
layout with a leading unit dim that makes the head a fast GEMV once folded keeps onnxruntime
from fusing it into MatMulNBits.

So the head runs MatMulNBits over the table quantized in 8-bit blocks along hidden (the block
of the body, a scale and zero point per block; int8 activations, the only 8-bit kernel that does
not dequantize per call), and a tied table is stored once: MatMulNBits'
B is [vocab, blocks, block] (the table's own row layout), so each lookup gathers the rows of its
tokens, still 8-bit, and dequantizes only them: ``(q - zero_point) * scale`` per block, reshaped
to [.., hidden]. An untied table is stored int8 per token and read the same way: its rows
gathered, then dequantized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.irutil.types import infer_types, set_dtype
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes import quantization as qz
from onnxsmith.passes.tied_head import LMHead, lookup_indices, lookup_rank, release, table_row

#: onnxruntime's CPU provider runs 8-bit MatMulNBits fast at accuracy_level 4 (int8 activations) only: at 0
#: it dequantizes the weight on every call (docs/quantize.md).
ACCURACY_LEVEL = 4
#: MatMulNBits' implied zero point of unsigned 8-bit data stored without zero points (symmetric).
_SYMMETRIC_OFFSET = 128


@dataclass
class NBitsHeadResult(ir.passes.PassResult):
    """What :class:`NBitsHeadPass` did: notes for the report and one row per weight."""

    notes: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)


class NBitsHeadPass(ir.passes.InPlacePass):
    """Run ``head`` as an 8-bit MatMulNBits (``head.matmul`` becomes that node) and, when tied, gather its
    embedding lookups from the same 8-bit rows; see the module doc."""

    def __init__(
        self, head: LMHead, *, block_size: int = 32, symmetric: bool = False, accuracy_level: int | None = None
    ) -> None:
        """``accuracy_level`` None: 4 (int8 activations), where onnxruntime has a kernel for 8-bit weights."""
        super().__init__()
        self.head = head
        self.block_size = block_size
        self.symmetric = symmetric
        self.accuracy_level = ACCURACY_LEVEL if accuracy_level is None else accuracy_level

    def call(self, model: ir.Model) -> NBitsHeadResult:
        result = NBitsHeadResult(model, True)
        graph, head = model.graph, self.head
        if any(lookup_indices(lookup).shape is None for lookup in head.lookups):
            infer_types(model)  # the lookups' rewrite needs the rank of their indices (before com.microsoft ops)
        names = FreshNames(graph)
        name = (head.tied_table.name if head.tied else head.weight.name) or "lm_head.weight"
        # a table already on symmetric 8-bit grids (a GGUF Q8_0 file's) is kept exactly; rounding it to the
        # asymmetric blocks would move it (SmolLM2's: 0.55 % relative error)
        grid = qz.on_symmetric_grid(head.weight_array, 8, self.block_size)
        blocked = grid or qz.quantize_blocked(head.weight_array, 8, self.block_size, self.symmetric)
        hidden = head.matmul.inputs[0]
        assert hidden is not None  # a MatMul reads two operands
        node = qz.matmul_nbits_node(graph, names, name, hidden, blocked, self.accuracy_level)
        graph.insert_before(head.matmul, node)
        model.opset_imports.setdefault("com.microsoft", 1)  # a model must import the domains it uses
        old, new = head.matmul.outputs[0], node.outputs[0]
        set_dtype(new, old.dtype)
        new.shape = old.shape
        ir.convenience.replace_nodes_and_values(graph, head.matmul, [head.matmul], [node], [old], [new])
        release(graph, head.weight)
        head.matmul = node
        if head.logits is old:  # the head computed the output itself: the new node's output took its place
            head.logits = new
        stored = f"MatMulNBits 8-bit, block {self.block_size}"
        if grid is not None:
            stored += ", on its grid (exact: symmetric blocks, as a GGUF Q8_0 file holds it)"
        error = qz.relative_error(head.weight_array, qz.dequantize_blocked(blocked))
        if head.tied:
            data, scales, *zero_points = node.inputs[1:]
            offset = zero_points[0] if zero_points else _SYMMETRIC_OFFSET
            assert data is not None and scales is not None and offset is not None  # initializers made above
            for lookup in head.lookups:
                self._lookup_rows(graph, lookup, data, scales, offset)
            table = head.tied_table
            release(graph, table)
            if table.uses():
                result.notes.append(
                    f"'{table.name}' is still read by something other than the lookups; its fp32 copy stays"
                )
            result.notes.append(
                f"tied embedding/LM head '{table.name}' [{head.vocab}, {head.hidden}] stored once ({stored}): "
                f"the head runs it as MatMulNBits (nothing dequantized per call), {len(head.lookups)} lookup(s) "
                "gather its 8-bit rows and dequantize only those"
            )
        else:
            result.notes.append(f"LM head '{name}' [{head.hidden}, {head.vocab}] runs as {stored} (untied)")
            if head.table is not None:
                self._store_untied_table(graph, result)
        result.rows.append(
            {
                "weight": name,
                "shape": f"{head.vocab}x{head.hidden}" if head.tied else f"{head.hidden}x{head.vocab}",
                "stored as": f"{stored} ({'tied ' if head.tied else ''}head)",
                "rel. error": error,
            }
        )
        return result

    def _store_untied_table(self, graph: ir.Graph, result: NBitsHeadResult) -> None:
        """An untied table int8, one scale per token (symmetric), as [vocab, 1, hidden]: its lookups gather
        their rows and dequantize only those (a DequantizeLinear would be run over the whole table per call)."""
        table = self.head.table
        assert table is not None and table.name is not None  # called with one; an initializer (find_lm_head)
        array = const_array(table)
        p = qz.quantize_per_channel_int8(array, axis=0)
        names = FreshNames(graph)
        data = add_initializer(graph, names(f"{table.name}_quantized"), p.q[:, None, :])
        scales = add_initializer(graph, names(f"{table.name}_scale"), p.scale[:, None])
        for lookup in [reader for reader, index in table.uses() if reader.op_type == "Gather" and index == 0]:
            self._lookup_rows(graph, lookup, data, scales, 0)
        release(graph, table)
        result.notes.append(
            f"embedding table '{table.name}' [{array.shape[0]}, {array.shape[1]}] stored int8, one scale per token; "
            "its lookups gather their rows and dequantize only those"
        )
        result.rows.append(table_row(table.name, array, p))

    def _lookup_rows(
        self, graph: ir.Graph, lookup: ir.Node, data: ir.Value, scales: ir.Value, zero_points: ir.Value | int
    ) -> None:
        """``Gather(table, ids)`` -> the rows of ``ids`` of ``data`` [vocab, blocks, block] dequantized with
        ``scales`` [vocab, blocks] and ``zero_points`` (like scales; or one integer offset): [*ids, hidden] in
        the table's dtype."""
        rank = lookup_rank(lookup)  # InputError unless the indices have a shape
        ids = lookup_indices(lookup)
        ids_shape = ids.shape
        assert ids_shape is not None  # lookup_rank read it
        label = lookup.name or "embedding"
        dtype = self.head.weight.dtype if self.head.weight.dtype is not None else ir.DataType.FLOAT
        assert data.shape is not None  # an initializer made with its array's shape
        blocks, block = data.shape[1], data.shape[2]
        hidden = self.head.hidden

        fresh = FreshNames(graph)

        def const(suffix: str, array: np.ndarray) -> ir.Value:
            return add_initializer(graph, fresh(f"{label}/{suffix}"), array)

        last = const("last_axis", np.array([-1], np.int64))
        nodes = [ir.node("Gather", [data, ids], {"axis": 0}, name=f"{label}/rows")]
        nodes.append(ir.node("Cast", nodes[-1].outputs, {"to": int(dtype)}, name=f"{label}/rows_float"))
        rows = nodes[-1].outputs[0]
        if isinstance(zero_points, int):
            offset = const("zero_point", np.array(zero_points, dtype.numpy()))
        else:
            nodes.append(ir.node("Gather", [zero_points, ids], {"axis": 0}, name=f"{label}/zero_points"))
            nodes.append(ir.node("Unsqueeze", [nodes[-1].outputs[0], last], name=f"{label}/zero_points_unit"))
            nodes.append(ir.node("Cast", nodes[-1].outputs, {"to": int(dtype)}, name=f"{label}/zero_points_float"))
            offset = nodes[-1].outputs[0]
        nodes.append(ir.node("Sub", [rows, offset], name=f"{label}/centered"))
        centered = nodes[-1].outputs[0]
        nodes.append(ir.node("Gather", [scales, ids], {"axis": 0}, name=f"{label}/scales"))
        nodes.append(ir.node("Unsqueeze", [nodes[-1].outputs[0], last], name=f"{label}/scales_unit"))
        nodes.append(ir.node("Mul", [centered, nodes[-1].outputs[0]], name=f"{label}/dequantized"))
        shape = const("shape", np.array([0] * rank + [blocks * block], np.int64))
        nodes.append(ir.node("Reshape", [nodes[-1].outputs[0], shape], name=f"{label}/hidden"))
        if blocks * block != hidden:  # the last block is padded
            starts, ends = const("starts", np.array([0], np.int64)), const("ends", np.array([hidden], np.int64))
            nodes.append(ir.node("Slice", [nodes[-1].outputs[0], starts, ends, last], name=f"{label}/unpadded"))
        old, new = lookup.outputs[0], nodes[-1].outputs[0]
        new.dtype = dtype
        new.shape = old.shape if old.shape is not None else ir.Shape([*ids_shape, hidden])
        ir.convenience.replace_nodes_and_values(graph, lookup, [lookup], nodes, [old], [new])
