"""Fold the shape arithmetic of a model: what is proven the same at every input size becomes a constant.

Exporters compute shapes at run time: the TorchScript exporter reads every
Reshape's target from ``Shape`` → ``Gather`` → ``Concat`` chains and builds a
ViT's 2-D RoPE angle table from the input's height and width through ``Range``,
``Tile`` and ``If``. For an input whose height and width are fixed all of that
is constant, and what is not (the batch) only ever scales one entry.

The symbolic-shape engine (:mod:`onnxsmith.analysis.symbolic_shapes`) says for every
value whether it is constant (independent of the free input dims and of the data), an
expression in the input dims, or unknown. This pass rewrites only what it proves --
never what merely happened to be equal at the sizes a model was run at (a detector's
``floor(H/32)`` is 1 at H = 1 and at H = 2):

* a constant computed from shapes becomes an initializer: its elements where the engine
  knows them (a Reshape target of fixed sizes), else its value, evaluated once from the
  constants behind it (:func:`constants_to_evaluate`, computed by
  :func:`onnxsmith.probes.evaluate.evaluate_constants`; a pass never runs a model) --
  when the shared rule of :mod:`onnxsmith.analysis.fold_cost` allows it: a table made
  from shapes alone (RoPE angles, masks), which the fused operators read as inputs, may
  take up to ``MAX_GENERATED_BYTES``;
* a Reshape whose result dims the engine knows gets a constant target: fixed sizes
  stay, the one free dim becomes -1 (the batch of a fixed-size image); with several
  (batch and sequence) those that copy the input's dim at the same place become 0 and
  at most one other -1;
* an Expand whose result dims the engine knows gets a constant target: 1 where the input's own dim
  already is the result's (broadcasting keeps it), fixed sizes literal (a decoder's repeat of its
  key/value heads: ``[1, 1, 3, 1, 1]`` instead of ``Shape``/``Gather``/``Concat``/``Where`` per layer);
* a Concat of one tensor with constants ``Expand``-ed along free dims (the CLS and
  register tokens ``Expand``-ed to the batch size) becomes ``Pad`` + ``Add`` of a
  constant table: exact, and it needs no batch size;
* anything else stays as it was.

Cos and Sin are left in place by default so that the rules downstream see the
angle table itself (the rotary rule computes its tables in float64).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxsmith.analysis.fold_cost import SMALL_FOLD, fold_cost, fold_refusal
from onnxsmith.analysis.input_roles import past_dims
from onnxsmith.analysis.symbolic_shapes import Dim, SymbolicShapes, as_int, is_int, same
from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import ConstantPool
from onnxsmith.irutil.types import ensure_types
from onnxsmith.irutil.walk import captured, subgraphs_of

#: Transcendental functions of constants stay nodes so their consumers choose the precision.
DEFAULT_KEEP_OPS = frozenset({"Cos", "Sin"})
#: Constants larger than this stay computed rather than stored.
MAX_FOLDED_ELEMENTS = 1 << 20
#: A table computed from shapes and scalars alone may add this much to the file; anything else SMALL_FOLD.
MAX_GENERATED_BYTES = 1 << 20


@dataclass
class ConstantsToEvaluate:
    """Constants the engine proved whose values it does not hold (:func:`constants_to_evaluate`).

    ``values``: to evaluate, in graph order; ``given``: the shape values on the way to them,
    with the elements the engine knows -- fed as inputs, so what is evaluated is the part of
    the graph between them and ``values``, which reads no input.
    """

    values: list[ir.Value] = field(default_factory=list)
    given: dict[ir.Value, np.ndarray] = field(default_factory=dict)


@dataclass
class EvaluatedConstants:
    """The values of :class:`ConstantsToEvaluate` by name; ``skipped``: why there are none (it did not run)."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    skipped: str = ""


@dataclass
class FoldShapesResult(ir.passes.PassResult):
    """What :class:`FoldShapesPass` did."""

    folded: int = 0  # constants computed from shapes replaced by initializers
    reshapes: int = 0  # Reshape targets made constant (-1 for the free dim, 0 to copy one)
    expands: int = 0  # Expand targets made constant (1 where the input's dim is kept)
    concats: int = 0  # Concats of batch-repeated constants turned into Pad + Add
    skipped: str = ""  # why the constants that needed evaluating were not folded


class FoldShapesPass(ir.passes.InPlacePass):
    """Replace what the engine proves constant, and Reshape targets it knows, by constants (see the module doc).

    ``evaluated``: the values of :func:`constants_to_evaluate` on this model as it is now
    (:func:`onnxsmith.probes.evaluate.evaluate_constants`); without them only the constants
    whose elements the engine knows are folded.
    """

    def __init__(
        self, evaluated: EvaluatedConstants | None = None, *, keep_ops: Iterable[str] = DEFAULT_KEEP_OPS
    ) -> None:
        super().__init__()
        self.evaluated = evaluated or EvaluatedConstants()
        self.keep_ops = frozenset(keep_ops)

    def call(self, model: ir.Model) -> FoldShapesResult:
        result = FoldShapesResult(model, False, skipped=self.evaluated.skipped)
        graph = model.graph
        may_be_zero = past_dims(model)
        ensure_types(model)
        shapes = SymbolicShapes(graph)
        constants = ConstantPool(graph, FreshNames(graph))
        for value in foldable(graph, shapes, self.keep_ops):
            array = _literal(shapes, value)
            if array is None:
                array = self.evaluated.arrays.get(value.name) if value.name is not None else None
            if array is None or array.size > MAX_FOLDED_ELEMENTS:
                continue
            if fold_refusal(fold_cost([value], array.nbytes), SMALL_FOLD, generated_limit=MAX_GENERATED_BYTES):
                continue
            _replace_uses(value, constants.get(array, f"{value.name}/folded"))
            result.folded += 1
        if result.folded:  # tables now constant give dims to what they feed (a RoPE table's rows)
            RemoveUnusedNodesPass()(model)
            shapes = SymbolicShapes(graph)
        for node in graph:
            if not (_is_op(node, "Reshape") or _is_op(node, "Expand")):
                continue
            old_target = node.inputs[1]
            assert old_target is not None  # Reshape's and Expand's shapes are required
            if ir.convenience.get_const_tensor(old_target) is not None:
                continue
            reshape = node.op_type == "Reshape"
            target = reshape_target(shapes, node, may_be_zero) if reshape else expand_target(shapes, node)
            if target is None:
                continue
            node.replace_input_with(1, constants.get(target, f"{old_target.name or 'shape'}/folded"))
            if reshape:
                if "allowzero" in node.attributes:  # opset >= 14; 0 (copy) is the default
                    node.attributes["allowzero"] = ir.AttrInt64("allowzero", 0)
                result.reshapes += 1
            else:
                result.expands += 1
        for node in list(graph):
            if (
                _is_op(node, "Concat")
                and not shapes.is_constant(node.outputs[0])
                and _pad_instead_of_concat(graph, node, shapes, constants)
            ):
                result.concats += 1
        RemoveUnusedNodesPass()(model)
        result.modified = bool(result.folded or result.reshapes or result.expands or result.concats)
        return result


def constants_to_evaluate(model: ir.Model, keep_ops: Iterable[str] = DEFAULT_KEEP_OPS) -> ConstantsToEvaluate:
    """What :class:`FoldShapesPass` needs evaluated: the constants it folds whose elements the engine does not hold."""
    graph = model.graph
    ensure_types(model)
    shapes = SymbolicShapes(graph)
    request = ConstantsToEvaluate()
    for value in foldable(graph, shapes, frozenset(keep_ops)):
        if _literal(shapes, value) is not None or _elements(shapes.dims(value)) > MAX_FOLDED_ELEMENTS:
            continue  # (a size the engine does not know is evaluated: the model computes it on every run anyway)
        given = _cut(value, shapes)
        if given is not None:
            request.values.append(value)
            request.given.update(given)
    return request


def foldable(graph: ir.Graph, shapes: SymbolicShapes, keep_ops: frozenset[str]) -> list[ir.Value]:
    """Constants computed from shapes that something not constant reads (in graph order): those worth folding.

    Only values computed (in part) from a Shape or Size: a constant computed from weights
    alone (a transposed or dequantised weight) is no shape computation, and folding it
    would store a second copy of a weight.
    """
    shaped: set[ir.Value] = set()
    kept: set[ir.Value] = set()  # what a kept op (Cos, Sin) computes, and what is computed from that
    for node in graph:
        reads = (*node.inputs, *(c for sub in subgraphs_of(node) for c in captured(sub)))
        if _is_op(node, "Shape") or _is_op(node, "Size"):
            shaped.update(node.outputs)  # (its dims only: the shape of a kept table is no table)
            continue
        if any(v in shaped for v in reads):
            shaped.update(node.outputs)
        if node.op_type in keep_ops or any(v in kept for v in reads):
            kept.update(node.outputs)

    def folded_away(user: ir.Node) -> bool:
        return (
            user.graph is graph
            and bool(user.outputs)
            and all(shapes.is_constant(out) and out not in kept for out in user.outputs)
        )

    found = []
    for node in graph:
        if node.op_type == "Constant":
            continue
        for value in node.outputs:
            if (
                value in shaped
                and value not in kept
                and value.name
                and not value.is_graph_output()
                and shapes.is_constant(value)
                and any(not folded_away(user) for user in value.consumers())
            ):
                found.append(value)
    return found


def reshape_target(
    shapes: SymbolicShapes, reshape: ir.Node, may_be_zero: frozenset[str] = frozenset()
) -> np.ndarray | None:
    """A constant target that gives ``reshape``'s result at every size of the free dims, or None.

    Fixed sizes are literal; one free dim becomes -1. With several (batch and sequence),
    those that copy the input's dim at the same place become 0 and at most one other -1.
    Only where the engine derived the result from the computed target's elements. ``may_be_zero``:
    input dims that can be 0 at run time (a KV cache's past length): a -1 cannot be inferred beside a
    copied dim that is 0, so a target that would need one is left computed.
    """
    if shapes.shape_value(reshape.inputs[1]) is None:
        return None
    result, data = shapes.dims(reshape.outputs[0]), shapes.dims(reshape.inputs[0])
    if result is None or any(is_int(d) and as_int(d) == 0 for d in result):
        return None  # a zero-size dim: 0 would mean "copy" in the target
    free = [i for i, d in enumerate(result) if not is_int(d)]
    target = np.array([as_int(d) if is_int(d) else -1 for d in result], np.int64)
    if len(free) > 1:
        copies = [i for i in free if data is not None and i < len(data) and same(result[i], data[i])]
        target[copies] = 0
        free = [i for i in free if i not in copies]
        if free and any(_may_be_zero(result[i], may_be_zero) for i in copies):
            return None
    return target if len(free) <= 1 else None


def _may_be_zero(dim: Dim, names: frozenset[str]) -> bool:
    """Whether ``dim`` is 0 where the input dims ``names`` are (others are taken to be at least 1)."""
    if is_int(dim) or not names:
        return is_int(dim) and as_int(dim) == 0
    zeros = {symbol: 0 for symbol in dim.free_symbols if getattr(symbol, "name", None) in names}
    return bool(zeros) and dim.subs(zeros) == 0


def expand_target(shapes: SymbolicShapes, expand: ir.Node) -> np.ndarray | None:
    """A constant target that gives ``expand``'s result at every size of the free dims, or None.

    1 where the input's dim (aligned from the right) is the result's, so broadcasting keeps it; a fixed size
    literal elsewhere. None where a free dim of the result is not the input's own at that place.
    """
    if shapes.shape_value(expand.inputs[1]) is None:
        return None
    result, data = shapes.dims(expand.outputs[0]), shapes.dims(expand.inputs[0])
    if result is None or data is None or len(data) > len(result):
        return None
    offset = len(result) - len(data)
    target = []
    for i, dim in enumerate(result):
        if i >= offset and same(dim, data[i - offset]):
            target.append(1)
        elif is_int(dim):
            target.append(as_int(dim))
        else:
            return None
    return np.array(target, np.int64)


def _literal(shapes: SymbolicShapes, value: ir.Value) -> np.ndarray | None:
    """A shape value's elements, in the value's own integer type."""
    array = shapes.literal(value)
    if array is None or value.dtype is None:
        return None
    return array.astype(value.dtype.numpy())


def _cut(value: ir.Value, shapes: SymbolicShapes) -> dict[ir.Value, np.ndarray] | None:
    """The shape values with known elements that bound the part of the graph ``value`` is computed by."""
    given: dict[ir.Value, np.ndarray] = {}
    seen: set[ir.Value] = set()
    pending = [value]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.const_value is not None and not current.is_graph_input():
            continue
        if current is not value:
            literal = _literal(shapes, current)
            if literal is not None:
                given[current] = literal
                continue
        node = current.producer()
        if node is None:
            return None  # a graph input: the engine's proof does not say how to evaluate it
        if node.op_type == "Constant":
            continue
        pending.extend(v for v in node.inputs if v is not None)
        pending.extend(v for sub in subgraphs_of(node) for v in captured(sub))
    return given


def _elements(dims: tuple[Dim, ...] | None) -> int:
    """How many elements dims of a constant hold (0 when not known)."""
    if dims is None or not all(is_int(d) for d in dims):
        return 0
    return int(np.prod([as_int(d) for d in dims]))


def _pad_instead_of_concat(graph: ir.Graph, concat: ir.Node, shapes: SymbolicShapes, constants: ConstantPool) -> bool:
    """Concat(c1, ..., x, ..., cn) = Pad(x) + table, where each c is a constant repeated along free dims."""
    axis = concat.attributes.get_int("axis", 0)
    pieces: list[np.ndarray | None] = []
    tensor = None
    for value in concat.inputs:
        piece = None
        if value is not None and value.const_value is not None and not value.is_graph_input():
            piece = value.const_value.numpy()
        elif value is not None:
            piece = _unrepeated(value, shapes)
        if piece is None:
            if tensor is not None or value is None:
                return False
            tensor = value
        pieces.append(piece)
    dims = shapes.dims(tensor) if tensor is not None else None
    repeated = any(p is not None and v is not None and v.const_value is None for p, v in zip(pieces, concat.inputs))
    if tensor is None or dims is None or tensor.dtype is None or not repeated:
        return False
    rank = len(dims)
    axis = axis + rank if axis < 0 else axis
    if not is_int(dims[axis]) or any(
        p is not None and (p.ndim != rank or p.dtype != tensor.dtype.numpy()) for p in pieces
    ):
        return False
    length = as_int(dims[axis])
    # The table: the pieces, with zeros where the tensor goes; 1 along every axis the Add broadcasts.
    template = next(p for p in pieces if p is not None)
    zeros_shape = [1 if d != axis else length for d in range(rank)]
    for d in range(rank):
        if d != axis and any(p is not None and p.shape[d] != template.shape[d] for p in pieces):
            return False
        if d != axis:
            zeros_shape[d] = template.shape[d]
    table = np.concatenate([p if p is not None else np.zeros(zeros_shape, template.dtype) for p in pieces], axis=axis)
    position = next(i for i, p in enumerate(pieces) if p is None)
    before = sum(p.shape[axis] for p in pieces[:position] if p is not None)  # all are: one piece is None
    after = sum(p.shape[axis] for p in pieces[position + 1 :] if p is not None)
    pads = np.zeros(2 * rank, np.int64)
    pads[axis], pads[rank + axis] = before, after
    pad = ir.node("Pad", [tensor, constants.get(pads, f"{concat.outputs[0].name}/folded")], num_outputs=1)
    pad.outputs[0].name = f"{concat.outputs[0].name}/padded"
    add = ir.node("Add", [pad.outputs[0], constants.get(table, f"{concat.outputs[0].name}/folded")], num_outputs=1)
    graph.insert_before(concat, [pad, add])
    result = concat.outputs[0]
    name = result.name
    result.replace_all_uses_with(add.outputs[0], replace_graph_outputs=True)
    result.name = None
    add.outputs[0].name = name
    return True


def _unrepeated(value: ir.Value, shapes: SymbolicShapes) -> np.ndarray | None:
    """A constant ``Expand``-ed along free dims: the constant, with size 1 along them (None: not that)."""
    node = value.producer()
    if node is None or not _is_op(node, "Expand") or node.inputs[0] is None:
        return None
    tensor = ir.convenience.get_const_tensor(node.inputs[0])
    dims = shapes.dims(value)
    if tensor is None or dims is None or len(dims) < len(tensor.shape) or all(is_int(d) for d in dims):
        return None
    array = tensor.numpy()
    array = array.reshape((1,) * (len(dims) - array.ndim) + array.shape)
    if any(not is_int(d) and array.shape[i] != 1 for i, d in enumerate(dims)):
        return None  # a free dim the constant is not repeated along
    try:
        return np.broadcast_to(array, [as_int(d) if is_int(d) else 1 for d in dims]).copy()
    except ValueError:
        return None


def _is_op(node: ir.Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _replace_uses(value: ir.Value, new: ir.Value) -> None:
    for user, index in list(value.uses()):
        user.replace_input_with(index, new)
