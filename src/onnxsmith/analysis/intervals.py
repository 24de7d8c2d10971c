"""Bounds on the values of integer tensors, proved without running the model.

An interval is ``(lo, hi)`` of Python ints (exact: no overflow in the reasoning
itself), or None when nothing can be said. :class:`Bounds` derives a value's
interval from its producer: constants by their values, index-making ops
(Shape, ArgMax, NonZero, ...) by the static dims they index, and value-moving
or arithmetic ops (Expand, Tile, Gather, Concat, Add, Mod, ...) from their
inputs' intervals. ``narrow_int64`` uses it to show that an int64 tensor fits
int32 before storing or computing it as int32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.walk import const_array

Interval = tuple[int, int]

INT32_RANGE: Interval = (-(2**31), 2**31 - 1)

#: The values a Cast from a small integer type can produce.
_TYPE_RANGE: dict[ir.DataType, Interval] = {
    ir.DataType.BOOL: (0, 1),
    ir.DataType.INT8: (-(2**7), 2**7 - 1),
    ir.DataType.UINT8: (0, 2**8 - 1),
    ir.DataType.INT16: (-(2**15), 2**15 - 1),
    ir.DataType.UINT16: (0, 2**16 - 1),
    ir.DataType.INT32: INT32_RANGE,
}

#: Ops whose output values are some of their inputs' values (moved, repeated, selected),
#: mapped to the input slots those values come from.
VALUE_MOVING: dict[str, tuple[int, ...] | None] = {
    "Identity": (0,),
    "Reshape": (0,),
    "Flatten": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Transpose": (0,),
    "Expand": (0,),
    "Tile": (0,),
    "Slice": (0,),
    "Gather": (0,),
    "GatherElements": (0,),
    "GatherND": (0,),
    "Split": (0,),
    "ReduceMax": (0,),
    "ReduceMin": (0,),
    "Concat": None,
    "Where": (1, 2),
    "ScatterElements": (0, 2),
    "ScatterND": (0, 2),
}


def fits_int32(interval: Interval | None) -> bool:
    return interval is not None and INT32_RANGE[0] <= interval[0] and interval[1] <= INT32_RANGE[1]


def of_array(array: np.ndarray) -> Interval:
    if array.size == 0:
        return (0, 0)
    return (int(array.min()), int(array.max()))


def hull(*intervals: Interval | None) -> Interval | None:
    if not intervals or any(i is None for i in intervals):
        return None
    return (min(i[0] for i in intervals), max(i[1] for i in intervals))


def static_dims(value: ir.Value | None) -> list[int] | None:
    if value is None or value.shape is None or not all(isinstance(d, int) for d in value.shape):
        return None
    return [int(d) for d in value.shape]


def static_size(value: ir.Value) -> int | None:
    dims = static_dims(value)
    return None if dims is None else math.prod(dims)


class Bounds:
    """Intervals of integer values, memoised; ``known`` seeds values measured elsewhere."""

    def __init__(self, known: dict[ir.Value, Interval] | None = None) -> None:
        self._memo: dict[ir.Value, Interval | None] = dict(known or {})

    def of(self, value: ir.Value | None) -> Interval | None:
        if value is None:
            return None
        if value not in self._memo:
            self._memo[value] = None  # a cycle (impossible in a valid graph) proves nothing
            self._memo[value] = self._derive(value)
        return self._memo[value]

    def _derive(self, value: ir.Value) -> Interval | None:
        if value.is_graph_input():
            return None
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is not None:  # read only integer constants (never a float weight)
            return of_array(tensor.numpy()) if tensor.dtype.is_integer() or tensor.dtype == ir.DataType.BOOL else None
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type in VALUE_MOVING:
            slots = VALUE_MOVING[node.op_type]
            sources = node.inputs if slots is None else [node.inputs[i] for i in slots if i < len(node.inputs)]
            return hull(*(self.of(v) for v in sources if v is not None))
        rule = _RULES.get(node.op_type)
        return None if rule is None else rule(self, node, value)


def _elementwise(combine: Callable[[Interval, Interval], Interval]):
    def rule(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
        intervals = [bounds.of(v) for v in node.inputs]
        if not intervals or any(i is None for i in intervals):
            return None
        result = intervals[0]
        for other in intervals[1:]:
            result = combine(result, other)
        return result

    return rule


def _mul(a: Interval, b: Interval) -> Interval:
    corners = [x * y for x in a for y in b]
    return (min(corners), max(corners))


def _div(a: Interval, b: Interval) -> Interval | None:
    if b[0] <= 0 <= b[1]:
        return None  # the divisor may be zero
    # Integer division rounds (toward zero or down); both are monotone, so corners bound it.
    corners = [f(x, y) for x in a for y in b for f in (lambda p, q: p // q, lambda p, q: int(p / q))]
    return (min(corners), max(corners))


def _abs(a: Interval) -> Interval:
    if a[0] >= 0:
        return a
    if a[1] <= 0:
        return (-a[1], -a[0])
    return (0, max(-a[0], a[1]))


def _mod(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    if node.attributes.get_int("fmod", 0):
        return None
    a, b = bounds.of(node.inputs[0]), bounds.of(node.inputs[1])
    if a is None or b is None:
        return None
    if b[0] > 0:  # the result takes the divisor's sign
        return (0, min(a[1], b[1] - 1)) if a[0] >= 0 else (0, b[1] - 1)
    if b[1] < 0:
        return (b[0] + 1, 0)
    return None


def _div_rule(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    a, b = bounds.of(node.inputs[0]), bounds.of(node.inputs[1])
    return None if a is None or b is None else _div(a, b)


def _neg(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    a = bounds.of(node.inputs[0])
    return None if a is None else (-a[1], -a[0])


def _abs_rule(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    a = bounds.of(node.inputs[0])
    return None if a is None else _abs(a)


def _max(a: Interval, b: Interval) -> Interval:
    return (max(a[0], b[0]), max(a[1], b[1]))


def _min(a: Interval, b: Interval) -> Interval:
    return (min(a[0], b[0]), min(a[1], b[1]))


def _clip(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    result = bounds.of(node.inputs[0])
    if result is None:
        return None
    low = node.inputs[1] if len(node.inputs) > 1 else None
    high = node.inputs[2] if len(node.inputs) > 2 else None
    if low is not None:
        result = None if bounds.of(low) is None else _max(result, bounds.of(low))
    if high is not None and result is not None:
        result = None if bounds.of(high) is None else _min(result, bounds.of(high))
    return result


def _range(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    # start + k * delta for 0 <= k < n lies between start and limit.
    return hull(bounds.of(node.inputs[0]), bounds.of(node.inputs[1]))


def _pad(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    fill = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] is not None else None
    mode = node.attributes.get_string("mode", "constant")
    fill_interval = (0, 0) if fill is None else bounds.of(fill)
    data = bounds.of(node.inputs[0])
    return data if mode != "constant" else hull(data, fill_interval)


def _sum_over(bounds: Bounds, data: ir.Value, count: int | None) -> Interval | None:
    a = bounds.of(data)
    if a is None or count is None:
        return None
    return (min(a[0], count * a[0]), max(a[1], count * a[1]))


def _cumsum(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    dims, axis = static_dims(node.inputs[0]), const_array(node.inputs[1])
    if dims is None or axis is None or not dims:
        return None
    sums = _sum_over(bounds, node.inputs[0], dims[int(axis.reshape(-1)[0])])
    # An exclusive sum starts from the empty sum: 0 is among its values, whatever the inputs.
    return hull(sums, (0, 0)) if node.attributes.get_int("exclusive", 0) else sums


def _reduce_sum(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    dims = static_dims(node.inputs[0])
    if dims is None:
        return None
    axes = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if axes is None:
        attr = node.attributes.get_ints("axes")
        axes = np.array(attr) if attr is not None else None
    if axes is None or axes.size == 0:
        count = math.prod(dims)
    else:
        count = math.prod(dims[int(a)] for a in axes.reshape(-1))
    return _sum_over(bounds, node.inputs[0], count)


def _cast(bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    source = node.inputs[0]
    if source is not None and source.dtype in (ir.DataType.INT64, ir.DataType.INT32, ir.DataType.UINT32):
        return bounds.of(source)
    return _TYPE_RANGE.get(source.dtype) if source is not None else None


def _shape(_bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    dims = static_dims(node.inputs[0])
    if dims is None:
        return None
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", len(dims))
    chosen = dims[slice(start, end)]
    return of_array(np.array(chosen)) if chosen else (0, 0)


def _size(_bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    count = static_size(node.inputs[0])
    return None if count is None else (count, count)


def _index_along(dims: list[int] | None, axis: int) -> Interval | None:
    if dims is None or not dims:
        return None
    return (0, max(dims[axis] - 1, 0))


def _arg_extreme(_bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    return _index_along(static_dims(node.inputs[0]), node.attributes.get_int("axis", 0))


def _nonzero(_bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    dims = static_dims(node.inputs[0])
    return None if dims is None else (0, max([d - 1 for d in dims] + [0]))


def _topk(bounds: Bounds, node: ir.Node, value) -> Interval | None:
    if value is node.outputs[0]:
        return bounds.of(node.inputs[0])
    return _index_along(static_dims(node.inputs[0]), node.attributes.get_int("axis", -1))


def _constant_of_shape(_bounds: Bounds, node: ir.Node, _value) -> Interval | None:
    attr = node.attributes.get("value")
    if attr is None:
        return (0, 0)
    return of_array(attr.value.numpy())


_RULES: dict[str, Callable[[Bounds, ir.Node, ir.Value], Interval | None]] = {
    "Add": _elementwise(lambda a, b: (a[0] + b[0], a[1] + b[1])),
    "Sub": _elementwise(lambda a, b: (a[0] - b[1], a[1] - b[0])),
    "Mul": _elementwise(_mul),
    "Max": _elementwise(_max),
    "Min": _elementwise(_min),
    "Div": _div_rule,
    "Mod": _mod,
    "Neg": _neg,
    "Abs": _abs_rule,
    "Clip": _clip,
    "Range": _range,
    "Pad": _pad,
    "CumSum": _cumsum,
    "ReduceSum": _reduce_sum,
    "Cast": _cast,
    "Shape": _shape,
    "Size": _size,
    "ArgMax": _arg_extreme,
    "ArgMin": _arg_extreme,
    "NonZero": _nonzero,
    "TopK": _topk,
    "ConstantOfShape": _constant_of_shape,
}
