"""Name every dim after the input dim it follows (the batch stays 'batch' through a Reshape to -1).

onnx's shape inference cannot see through ``Reshape(x, [-1, 201, 2, 64])`` when
x's first dim is symbolic: the result's first dim is a fresh ``unk__N``, a
different one after every Reshape, and a rule that checks that q, k and v
share a batch size cannot match. This pass infers shapes with each symbolic
input dim set to a concrete size, then again with each dim changed
(:func:`varied`), and names an inferred dim after the input dim it moved with.
Unnamed symbolic input dims are named first (:func:`name_input_dims`).
"""

from __future__ import annotations

import logging

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

Shape = tuple[int, ...] | None


def varied(size: int) -> int:
    """The other size a symbolic dim is tried at: double (a stride-2 network still divides it), 0 -> 1."""
    return max(2 * size, size + 1)


def name_input_dims(model: ir.Model) -> list[str]:
    """Give every unnamed symbolic dim of the graph inputs a name ('<input>_dim<axis>'); return all symbolic dim names."""
    names: list[str] = []
    for value in model.graph.inputs:
        if value.shape is None or value.const_value is not None:
            continue
        dims = list(value.shape)
        for axis, dim in enumerate(dims):
            if isinstance(dim, int):
                continue
            if dim.value in (None, "", "?"):  # unnamed (some exporters write a literal '?')
                dims[axis] = ir.SymbolicDim(f"{value.name}_dim{axis}")
            if dims[axis].value not in names:
                names.append(dims[axis].value)
        value.shape = ir.Shape(dims)
    return names


class NameDimsPass(ir.passes.InPlacePass):
    """``dims``: the symbolic input dims with a size to infer at (any valid size will do)."""

    def __init__(self, dims: dict[str, int]) -> None:
        super().__init__()
        self.dims = dict(dims)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        declared = {v: v.shape for v in graph.inputs}
        values = [out for node in graph for out in node.outputs]
        previous = {v: v.shape for v in values}
        names = sorted(self.dims)
        assignments = [dict(self.dims)] + [{**self.dims, n: varied(self.dims[n])} for n in names]
        runs: list[dict[ir.Value, Shape]] = []
        logging.getLogger("onnx_ir.passes.common.shape_inference").setLevel(logging.ERROR)
        try:
            for sizes in assignments:
                for value, shape in declared.items():
                    if shape is not None:
                        value.shape = ir.Shape([_size(d, sizes) for d in shape])
                for value in values:
                    value.shape = None
                ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
                runs.append({v: _concrete(v.shape) for v in values})
        finally:
            for value, shape in declared.items():
                value.shape = shape
        modified = False
        for value in values:
            shape = _merge([run[value] for run in runs], names, self.dims)
            value.shape = shape if shape is not None else previous[value]
            modified |= value.shape != previous[value]
        return ir.passes.PassResult(model, modified)


def _size(dim, sizes: dict[str, int]):
    if isinstance(dim, int):
        return dim
    return sizes.get(dim.value, dim) if dim.value else dim


def _concrete(shape: ir.Shape | None) -> Shape:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _merge(shapes: list[Shape], names: list[str], base: dict[str, int]) -> ir.Shape | None:
    """Run 0 is at the base sizes, run k+1 has dim names[k] varied."""
    if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return None
    first = shapes[0]
    dims: list[int | str | None] = []
    for axis, size in enumerate(first):
        moved = [names[k] for k, s in enumerate(shapes[1:]) if s[axis] != size]
        if not moved:
            dims.append(size)
        elif len(moved) == 1 and size == base[moved[0]] and shapes[1 + names.index(moved[0])][axis] == varied(size):
            dims.append(moved[0])
        else:
            dims.append(None)
    return ir.Shape(dims)
