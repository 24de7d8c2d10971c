"""Compute only the token rows that are read: output-driven row pruning.

A ViT classifier reads one row of the last block's output (the CLS token);
everything that row depends on in the last block except keys and values is
per-token work done 200 times for nothing. This pass walks the graph from the
outputs backwards and records, for every value, which rows of its tokens axis
(axis -2) its consumers read. A row selection (Gather or Slice on that axis)
asks for its rows; a per-token op (MatMul by a weight, LayerNorm, elementwise
ops, Gelu, SkipLayerNorm, RotaryEmbedding, the query of MultiHeadAttention)
passes the request up to its inputs; anything else reads all rows. Then every
per-token op whose outputs are read only in a sub-range computes that range
alone: its inputs are sliced where they still hold more rows, the selection
below it is re-indexed, RotaryEmbedding's position offset moves with the rows,
and MultiHeadAttention keeps all keys and values for a shorter query.

Nothing is DINOv3-specific: BERT's pooler, ViT's CLS head and any last-token
reader are the same pattern.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import ConstantPool
from onnxsmith.irutil.types import set_dtype
from onnxsmith.irutil.walk import constant

ALL: Final = None  # "every row" in a demand
Rows = tuple[int, int] | None  # [start, stop) of the tokens axis, or ALL
Computed = dict[ir.Node, tuple[int, int]]  # the rows a pruned node computes

_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "Greater"})
_UNARY = frozenset(
    {
        "Relu",
        "Gelu",
        "Erf",
        "Sigmoid",
        "Tanh",
        "Neg",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Abs",
        "Cast",
        "Identity",
        "Softplus",
        "HardSigmoid",
        "LeakyRelu",
        "Elu",
        "Not",
        "Sign",
        "Round",
    }
)
_CONTRIB_UNARY = frozenset({"Gelu", "FastGelu", "QuickGelu"})
# MultiHeadAttention inputs that depend on the query's length, and the KV cache.
_MHA_ATTENTION_BIAS, _MHA_PAST = 5, 6


@dataclass
class PruneRowsResult(ir.passes.PassResult):
    """What :class:`PruneRowsPass` did: the nodes that compute fewer rows."""

    pruned: list[tuple[ir.Node, tuple[int, int], int]] = field(
        default_factory=list
    )  # (node, rows it computes, rows it had)


class PruneRowsPass(ir.passes.InPlacePass):
    """See the module doc. Shapes must be known (run infer_types first)."""

    def call(self, model: ir.Model) -> PruneRowsResult:
        self._result = PruneRowsResult(model, False)  # filled while the pass runs
        graph = model.graph
        nodes = list(graph)
        demand: dict[ir.Value, Rows] = {v: ALL for v in graph.outputs}
        selections: dict[ir.Node, tuple[tuple[int, int], int]] = {}  # rows read, tokens before pruning
        computed: Computed = {}
        token_inputs_of: dict[ir.Node, list[int]] = {}
        for node in reversed(nodes):
            read = [demand[out] for out in node.outputs if out in demand]
            rows = _hull(read) if read else ALL
            token_inputs = _token_inputs(node) if read and rows is not ALL else None
            if rows is not ALL and token_inputs is not None and rows != (0, _length(node.outputs[0])):
                computed[node] = rows
                token_inputs_of[node] = token_inputs
                for i, value in enumerate(node.inputs):
                    if value is not None:
                        _ask(demand, value, rows if i in token_inputs else ALL)
                continue
            selected = _selected_rows(node)
            if selected is not None:
                tokens = _length(node.inputs[0])
                assert tokens is not None  # _selected_rows found it
                selections[node] = selected, tokens
            for i, value in enumerate(node.inputs):
                if value is not None:
                    _ask(demand, value, selected if (i == 0 and selected is not None) else ALL)
        if not computed:
            self._result.modified = False
            return self._result
        constants = ConstantPool(graph, FreshNames(graph))
        self._slices: dict[tuple[ir.Value, int, int], ir.Value] = {}  # one Slice per value and rows
        for node in nodes:
            if node in computed:
                self._narrow(graph, node, token_inputs_of[node], computed, constants)
            elif node in selections:
                _reindex(node, selections[node], computed, constants)
        self._result.modified = True
        return self._result

    def _narrow(
        self, graph: ir.Graph, node: ir.Node, token_inputs: list[int], computed: Computed, constants: ConstantPool
    ) -> None:
        start, stop = computed[node]
        length = _length(node.outputs[0])
        assert length is not None  # _token_inputs read it
        for i in token_inputs:
            value = node.inputs[i]
            assert value is not None  # _token_inputs: a token input is a value
            have = _rows_held(value, computed)
            if have == (start, stop):
                continue
            offset = have[0] if have is not ALL else 0
            node.replace_input_with(i, self._slice(graph, node, value, start - offset, stop - offset, constants))
        if node.op_type == "RotaryEmbedding" and start:
            positions = node.inputs[1]
            position = constant(positions)
            assert positions is not None and position is not None  # _token_inputs: a constant offset
            moved = (position.astype(np.int64) + start).reshape(position.shape)
            node.replace_input_with(1, constants.get(moved, f"{positions.name}_plus_{start}"))
        for out in node.outputs:
            if out.shape is not None and out.shape.rank() >= 2:
                dims = list(out.shape)
                dims[-2] = stop - start
                out.shape = ir.Shape(dims)
        self._result.pruned.append((node, (start, stop), length))

    def _slice(
        self, graph: ir.Graph, before: ir.Node, value: ir.Value, start: int, stop: int, constants: ConstantPool
    ) -> ir.Value:
        """Rows [start, stop) of ``value``'s tokens axis: a sliced constant, or a Slice node, made
        once for all the nodes that read those rows (before the first of them, in graph order)."""
        array = constant(value)
        if array is not None:
            return constants.get(np.ascontiguousarray(array[..., start:stop, :]), f"{value.name}/rows_{start}_{stop}")
        key = (value, start, stop)
        if key not in self._slices:
            self._slices[key] = _slice_node(graph, before, value, start, stop, constants)
        return self._slices[key]


def _ask(demand: dict[ir.Value, Rows], value: ir.Value, rows: Rows) -> None:
    demand[value] = _hull([demand[value], rows]) if value in demand else rows


def _hull(rows: list[Rows]) -> Rows:
    bounded = [r for r in rows if r is not ALL]
    if len(bounded) < len(rows):
        return ALL
    return min(r[0] for r in bounded), max(r[1] for r in bounded)


def _rows_held(value: ir.Value, computed: Computed) -> Rows:
    producer = value.producer()
    return computed.get(producer, ALL) if producer is not None else ALL


def _length(value: ir.Value | None) -> int | None:
    assert value is not None  # a value its op requires (it was read without a check before)
    shape = value.shape
    if shape is None or shape.rank() < 2 or not isinstance(shape[-2], int):
        return None
    return int(shape[-2])


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else value.shape.rank()


def _token_inputs(node: ir.Node) -> list[int] | None:
    """Which inputs carry the tokens axis (-2) of the output, if the node works token by token."""
    out = node.outputs[0] if node.outputs else None
    length = _length(out) if out is not None else None
    rank = _rank(out)
    if length is None or rank is None:  # a length, so a shape and a rank
        return None
    op, domain = node.op_type, node.domain
    standard = domain in ("", "ai.onnx")
    if standard and (op in _UNARY or op in ("Softmax", "LogSoftmax")):
        if op in ("Softmax", "LogSoftmax") and node.attributes.get_int("axis", -1) not in (-1, rank - 1):
            return None
        return [0] if _rank(node.inputs[0]) == rank else None
    if standard and op in _ELEMENTWISE:
        token = []
        for i, value in enumerate(node.inputs):
            shape = value.shape if value is not None else None  # what _rank reads
            if shape is None:
                return None
            r = shape.rank()
            if r == rank and shape[-2] == length:
                token.append(i)
            elif r >= 2 and shape[-2] != 1:
                return None
        return token or None
    if standard and op == "MatMul":
        return [0] if _rank(node.inputs[1]) == 2 and _rank(node.inputs[0]) == rank else None
    if standard and op == "LayerNormalization":
        return [0] if node.attributes.get_int("axis", -1) in (-1, rank - 1) else None
    if domain != "com.microsoft":
        return None
    if op in _CONTRIB_UNARY or op == "BiasGelu":
        return [0]
    if op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        if any(out.uses() for out in node.outputs[1:3]) or _length(node.inputs[1]) != length:
            return None
        return [0, 1]
    if op == "RotaryEmbedding":
        position = constant(node.inputs[1])
        return [0] if position is not None and position.size == 1 else None
    if op == "MultiHeadAttention":
        extra = node.inputs[_MHA_ATTENTION_BIAS:]
        if any(v is not None for v in extra) or any(o.uses() for o in node.outputs[1:]) or rank != 3:
            return None
        return [0]
    return None


def _selected_rows(node: ir.Node) -> tuple[int, int] | None:
    """The rows of input 0's tokens axis a Gather or Slice on that axis reads; None for other nodes."""
    if node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    length, rank = _length(node.inputs[0]), _rank(node.inputs[0])
    if length is None or rank is None:  # a length, so a shape and a rank
        return None
    if node.op_type == "Gather":
        axis = node.attributes.get_int("axis", 0)
        index = constant(node.inputs[1])
        if axis not in (rank - 2, -2) or index is None or index.size == 0:
            return None
        index = np.where(index < 0, index + length, index)
        return int(index.min()), int(index.max()) + 1
    if node.op_type == "Slice" and len(node.inputs) >= 4:
        starts, ends, axes = (constant(node.inputs[i]) for i in (1, 2, 3))
        steps = constant(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else np.ones(1)
        if starts is None or ends is None or axes is None or steps is None:
            return None
        if any(a.size != 1 for a in (starts, ends, axes, steps)) or int(steps.reshape(())) != 1:
            return None
        if int(axes.reshape(())) not in (rank - 2, -2):
            return None
        start, stop = (int(v.reshape(())) for v in (starts, ends))
        start = max(0, start + length if start < 0 else start)
        stop = min(length, stop + length if stop < 0 else stop)
        return (start, stop) if start < stop else None
    return None


def _reindex(
    node: ir.Node, selection: tuple[tuple[int, int], int], computed: Computed, constants: ConstantPool
) -> None:
    """Point a row selection at the same rows of an input that now holds only rows ``have``.

    Always in absolute row numbers from ``have``'s start: even when it starts at row 0, a
    negative index or bound counts from the end, which has moved."""
    selected, length = selection
    data = node.inputs[0]
    assert data is not None  # _selected_rows read its length
    have = _rows_held(data, computed)
    if have is ALL:
        return
    offset = have[0]
    if node.op_type == "Gather":
        index = constant(node.inputs[1])
        assert index is not None  # _selected_rows read it
        absolute = np.where(index < 0, index + length, index)
        node.replace_input_with(1, constants.get((absolute - offset).astype(index.dtype), "row_index"))
    else:
        start, stop = selected
        node.replace_input_with(1, constants.get(np.array([start - offset], np.int64), "row_start"))
        node.replace_input_with(2, constants.get(np.array([stop - offset], np.int64), "row_stop"))


def _slice_node(
    graph: ir.Graph, before: ir.Node, value: ir.Value, start: int, stop: int, constants: ConstantPool
) -> ir.Value:
    """A Slice of rows [start, stop) of ``value``'s tokens axis, inserted before ``before``."""
    node = ir.node(
        "Slice",
        [
            value,
            constants.get(np.array([start], np.int64), "row_start"),
            constants.get(np.array([stop], np.int64), "row_stop"),
            constants.get(np.array([-2], np.int64), "tokens_axis"),
        ],
        num_outputs=1,
    )
    out = node.outputs[0]
    out.name = constants.names(f"{value.name}/rows_{start}_{stop}")
    set_dtype(out, value.dtype)
    if value.shape is not None:
        dims = list(value.shape)
        dims[-2] = stop - start
        out.shape = ir.Shape(dims)
    graph.insert_before(before, node)
    return out
