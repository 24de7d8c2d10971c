"""Fold the shape arithmetic of a model whose input sizes are fixed except for a few named dims.

Exporters compute shapes at run time: the TorchScript exporter reads every
Reshape's target from ``Shape`` → ``Gather`` → ``Concat`` chains and builds a
ViT's 2-D RoPE angle table from the input's height and width through ``Range``,
``Tile`` and ``If``. For an input whose height and width are fixed all of that
is constant, and what is not (the batch) only ever scales one entry.

Rather than reason about each op symbolically, the part of the graph that
depends only on constants and on input shapes (the "static" values) is
*evaluated*: :func:`onnxsmith.runtime.evaluate.evaluate_shapes` runs the model
in onnxruntime once at the base sizes and once more per symbolic dim with that
dim changed (doubled), and this pass, given those runs (:class:`ShapeRuns`),
rewrites the graph:

* a static value that is the same in every run is a constant: it becomes an
  initializer and the nodes that computed it go away -- when the shared rule of
  :mod:`onnxsmith.analysis.fold_cost` allows it: a dequantised int8 weight or a copy
  of a weight other nodes read would grow the file, so it stays computed (an Identity
  of a constant is read as that constant instead); a table made from shapes alone
  (RoPE angles, masks), which the fused operators read as inputs, may take up to
  ``MAX_GENERATED_BYTES``;
* a Reshape target becomes a constant: its result's shape with -1 where it
  follows the one free dim (the batch of a fixed-size image); with several free
  dims (batch and sequence) those that copy the input's dim become 0;
* a Concat of one tensor with constants repeated along the batch (the CLS and
  register tokens ``Expand``-ed to the batch size) becomes ``Pad`` + ``Add`` of
  a constant table: exact, and it needs no batch size;
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
from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import ConstantPool
from onnxsmith.irutil.types import infer_types
from onnxsmith.irutil.walk import captured, subgraphs_of

#: Transcendental functions of constants stay nodes so their consumers choose the precision.
DEFAULT_KEEP_OPS = frozenset({"Cos", "Sin"})
#: Static values larger than this stay computed rather than stored.
MAX_FOLDED_ELEMENTS = 1 << 20
#: A table computed from shapes and scalars alone may add this much to the file; anything else SMALL_FOLD.
MAX_GENERATED_BYTES = 1 << 20
_NONDETERMINISTIC = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial"})


@dataclass
class ShapeRuns:
    """The evaluated static values (:func:`shape_values`), by name, once per assignment of the symbolic dims.

    The first run is at the base sizes, each further one with one dim changed. A Reshape
    whose target is among them also has its data's and its result's shapes
    (:func:`shape_probe`). ``skipped``: why there are no runs (the model did not run).
    """

    runs: list[dict[str, np.ndarray]] = field(default_factory=list)
    skipped: str = ""


@dataclass
class FoldShapesResult(ir.passes.PassResult):
    """What :class:`FoldShapesPass` did."""

    folded: int = 0  # static values replaced by constants
    reshapes: int = 0  # Reshape targets made constant (-1 for the free dim, 0 to copy one)
    concats: int = 0  # Concats of batch-repeated constants turned into Pad + Add
    skipped: str = ""  # why nothing was folded, when the evaluation failed


class FoldShapesPass(ir.passes.InPlacePass):
    """Replace what depends only on constants and input shapes by constants (see the module doc).

    ``evaluation``: the static values evaluated at several sizes of the symbolic input dims
    that stay dynamic (:func:`onnxsmith.runtime.evaluate.evaluate_shapes`, on this model as it
    is now).
    """

    def __init__(self, evaluation: ShapeRuns, *, keep_ops: Iterable[str] = DEFAULT_KEEP_OPS) -> None:
        super().__init__()
        self.evaluation = evaluation
        self.keep_ops = frozenset(keep_ops)

    def call(self, model: ir.Model) -> FoldShapesResult:
        self._result = FoldShapesResult(model, False)  # filled while the pass runs
        graph = model.graph
        static = _static_values(graph, self.keep_ops)
        frontier = _frontier(graph, static)
        if not frontier:
            self._result.modified = False
            return self._result
        if self.evaluation.skipped:  # the model does not run at a varied size: leave it as it is
            self._result.skipped = self.evaluation.skipped
            self._result.modified = False
            return self._result
        runs = self.evaluation.runs
        constants = ConstantPool(graph, FreshNames(graph))
        varying: dict[ir.Value, list[np.ndarray]] = {}
        for value in frontier:
            arrays = [run[value.name] for run in runs]
            if arrays[0].size > MAX_FOLDED_ELEMENTS:
                continue
            if all(_same(arrays[0], a) for a in arrays[1:]):
                source = _identity_of_constant(value)
                if source is not None:
                    _replace_uses(value, source)
                elif fold_refusal(
                    fold_cost([value], arrays[0].nbytes), SMALL_FOLD, generated_limit=MAX_GENERATED_BYTES
                ):
                    continue
                else:
                    _replace_uses(value, constants.get(arrays[0], f"{value.name}/folded"))
                self._result.folded += 1
                continue
            varying[value] = arrays
            for user, index in list(value.uses()):
                if _is_op(user, "Reshape") and index == 1 and shape_probe(user, "out") in runs[0]:
                    target = _reshape_target(
                        [run[shape_probe(user, "out")] for run in runs], [run[shape_probe(user, "in")] for run in runs]
                    )
                    if target is not None:
                        user.replace_input_with(1, constants.get(target, f"{value.name}/folded"))
                        if "allowzero" in user.attributes:  # opset >= 14; 0 (copy) is the default
                            user.attributes["allowzero"] = ir.AttrInt64("allowzero", 0)
                        self._result.reshapes += 1
        if varying:
            infer_types(model)  # the static length of the tensor a Concat pads
            for node in list(graph):
                if (
                    _is_op(node, "Concat")
                    and not _is_static(node, static)
                    and _pad_instead_of_concat(graph, node, varying, constants)
                ):
                    self._result.concats += 1
        RemoveUnusedNodesPass()(model)
        self._result.modified = bool(self._result.folded or self._result.reshapes or self._result.concats)
        return self._result


def shape_values(graph: ir.Graph, keep_ops: Iterable[str] = DEFAULT_KEEP_OPS) -> list[ir.Value]:
    """The static values worth evaluating (in graph order): those something non-static reads."""
    keep = frozenset(keep_ops)
    return _frontier(graph, _static_values(graph, keep))


def _static_values(graph: ir.Graph, keep_ops: frozenset[str]) -> set[ir.Value]:
    """Values of the main graph that depend only on constants and on the shapes of other values."""
    static: set[ir.Value] = set()

    def known(value: ir.Value | None) -> bool:
        if value is None or value in static:
            return True
        return value.const_value is not None and not value.is_graph_input()

    for node in graph:
        if node.domain not in ("", "ai.onnx") or node.op_type in keep_ops or node.op_type in _NONDETERMINISTIC:
            continue
        if node.op_type in ("Shape", "Size") or (
            all(known(v) for v in node.inputs) and all(known(v) for sub in subgraphs_of(node) for v in captured(sub))
        ):
            static.update(node.outputs)
    return static


def _frontier(graph: ir.Graph, static: set[ir.Value]) -> list[ir.Value]:
    """Static values something non-static reads (in graph order): the ones worth evaluating."""
    found = []
    outputs = set(graph.outputs)
    for node in graph:
        if node.op_type == "Constant":
            continue
        for value in node.outputs:
            if value not in static or value in outputs or not value.name:
                continue
            if any(not _is_static(user, static) for user in value.consumers()):
                found.append(value)
    return found


def _is_static(node: ir.Node, static: set[ir.Value]) -> bool:
    return bool(node.outputs) and node.outputs[0] in static


def shape_probe(reshape: ir.Node, side: str) -> str:
    """The name under which an evaluation reports a Reshape's data ("in") or result ("out") shape."""
    return f"onnxsmith::{side}_shape::{reshape.outputs[0].name}"


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def _reshape_target(results: list[np.ndarray], inputs: list[np.ndarray]) -> np.ndarray | None:
    """A constant Reshape target that gives each run's result shape from each run's input.

    Entries that never change are literal; one changing entry becomes -1 (the batch of a
    fixed-size image). With several (batch and sequence), those that copy the input's
    dim at the same place become 0 and at most one other becomes -1; else None.
    """
    out = np.stack(results).astype(np.int64)
    if (out[0] == 0).any():
        return None  # a zero-size dim: 0 would mean "copy" in the target
    varying = list(np.flatnonzero((out != out[0]).any(axis=0)))
    target = out[0].copy()
    if len(varying) > 1:
        data = np.stack(inputs).astype(np.int64)
        copies = [i for i in varying if i < data.shape[1] and (out[:, i] == data[:, i]).all()]
        target[copies] = 0
        varying = [i for i in varying if i not in copies]
    if len(varying) > 1:
        return None
    target[varying] = -1
    return target


def _pad_instead_of_concat(
    graph: ir.Graph, concat: ir.Node, varying: dict[ir.Value, list[np.ndarray]], constants: ConstantPool
) -> bool:
    """Concat(c1, ..., x, ..., cn) = Pad(x) + table, where each c is a constant repeated along free dims."""
    axis = concat.attributes.get_int("axis", 0)
    pieces: list[np.ndarray | None] = []
    tensor = None
    for value in concat.inputs:
        piece = None
        if value in varying:
            piece = _unrepeated(varying[value])
        elif value is not None and value.const_value is not None and not value.is_graph_input():
            piece = value.const_value.numpy()
        if piece is None:
            if tensor is not None or value is None:
                return False
            tensor = value
        pieces.append(piece)
    if tensor is None or tensor.shape is None or tensor.dtype is None or len(pieces) < 2:
        return False
    rank = len(tensor.shape)
    axis = axis + rank if axis < 0 else axis
    length = tensor.shape[axis]
    if not isinstance(length, int) or any(
        p is not None and (p.ndim != rank or p.dtype != tensor.dtype.numpy()) for p in pieces
    ):
        return False
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
    before = sum(p.shape[axis] for p in pieces[:position])
    after = sum(p.shape[axis] for p in pieces[position + 1 :])
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


def _unrepeated(arrays: list[np.ndarray]) -> np.ndarray | None:
    """The array with size 1 along every axis whose size changed between runs, if it only repeated there."""
    shapes = {a.shape for a in arrays}
    if len({len(s) for s in shapes}) != 1:
        return None
    grown = [d for d in range(arrays[0].ndim) if len({s[d] for s in shapes}) > 1]
    if not grown:
        return None
    for array in arrays:
        first = array
        for d in grown:
            first = first.take([0], axis=d)
        if not np.array_equal(np.broadcast_to(first, array.shape), array):
            return None
    return first


def _is_op(node: ir.Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _identity_of_constant(value: ir.Value) -> ir.Value | None:
    """The constant an Identity chain passes on unchanged (read it instead of storing a copy), else None."""
    while (node := value.producer()) is not None and _is_op(node, "Identity"):
        value = node.inputs[0]
    if value.is_graph_input() or ir.convenience.get_const_tensor(value) is None:
        return None
    return value if value.producer() is None or value.producer().op_type == "Constant" else None


def _replace_uses(value: ir.Value, new: ir.Value) -> None:
    for user, index in list(value.uses()):
        user.replace_input_with(index, new)
