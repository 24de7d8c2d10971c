"""What a graph's shape arithmetic computes, as expressions in its input dims.

Exporters compute shapes at run time: a Reshape's target comes from ``Shape`` ->
``Gather`` -> ``Unsqueeze`` -> ``Concat`` chains, re-evaluated on every call. To replace
such a chain by a constant, or to drop a Reshape pair, a pass must know what the
chain computes in terms of the dims of the tensors it reads. This module tells it,
soundly: when it is not sure, it says "unknown".

Every axis of every value gets a *dim*: an int when static, else a sympy expression
over the named input dims (``batch_size``, ``past_sequence_length + sequence_length``)
and fresh symbols for dims it cannot relate to them. Two axes get equal dims only
when the graph guarantees they are equal: the same named input dim, an elementwise
op that cannot broadcast on that axis, a Transpose, a MatMul's rows, a Reshape that
copies a dim, ... A fresh symbol stands for "some size", so an expression with one
never equals anything it was not derived from.

Small integer tensors computed from shapes (``Shape``, ``Gather``, ``Slice``, ``Concat``,
``Unsqueeze``, ``Squeeze``, ``Cast``, ``Add``/``Sub``/``Mul``/``Div``) get *shape values*:
their elements as dims. A Reshape whose target's shape value is known has known output
dims, and the analysis continues through it.

Only the main graph is analysed, in graph order (ONNX graphs are topologically sorted);
anything a subgraph computes, and every op not listed here, gives fresh dims.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import count

import numpy as np
import onnx_ir as ir
import sympy

Dim = int | sympy.Expr

#: Integer tensors longer than this are not shape values.
MAX_SHAPE_VALUE = 16

#: Ops whose first output has the shape of their first input.
SAME_SHAPE = frozenset(
    {
        "Identity",
        "Cast",
        "CastLike",
        "Relu",
        "LeakyRelu",
        "Elu",
        "Selu",
        "Gelu",
        "Tanh",
        "Sigmoid",
        "HardSigmoid",
        "Softplus",
        "Erf",
        "Neg",
        "Abs",
        "Sqrt",
        "Reciprocal",
        "Exp",
        "Log",
        "Sin",
        "Cos",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "Not",
        "IsNaN",
        "IsInf",
        "Softmax",
        "LogSoftmax",
        "Clip",
        "Dropout",
        "LayerNormalization",
        "RMSNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "FastGelu",
        "QuickGelu",
        "BiasGelu",
        "Trilu",
        "CumSum",
        "Mish",
        "HardSwish",
        "Swish",
        "DequantizeLinear",
        "QuantizeLinear",
    }
)
#: Elementwise ops that broadcast their inputs against each other (numpy rules).
BROADCAST = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Mod",
        "Max",
        "Min",
        "Mean",
        "Sum",
        "Where",
        "And",
        "Or",
        "Xor",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "BitwiseAnd",
        "BitwiseOr",
        "PRelu",
    }
)
_INT_TYPES = frozenset({ir.DataType.INT64, ir.DataType.INT32})
_SUM = re.compile(r"\s*[A-Za-z_0-9][A-Za-z0-9_.]*(\s*[+-]\s*[A-Za-z_0-9][A-Za-z0-9_.]*)*\s*")


def named_dim(name: str) -> sympy.Expr:
    """A declared dim: a symbol, or a sum of symbols and ints (optimum writes 'past_sequence_length + 1')."""
    if _SUM.fullmatch(name):
        total, sign = sympy.Integer(0), 1
        for token in re.findall(r"[+-]|[A-Za-z_0-9][A-Za-z0-9_.]*", name):
            if token in "+-":
                sign = 1 if token == "+" else -1
            else:
                term = (
                    sympy.Integer(int(token))
                    if token.isdigit()
                    else sympy.Symbol(token, integer=True, nonnegative=True)
                )
                total += sign * term
        return total
    return sympy.Symbol(name, integer=True, nonnegative=True)  # anything else: the whole name is one dim


def is_int(dim: Dim | None) -> bool:
    return isinstance(dim, int) or (isinstance(dim, sympy.Expr) and dim.is_Integer)


def as_int(dim: Dim) -> int:
    return int(dim)


def same(a: Dim | None, b: Dim | None) -> bool:
    """Whether two dims are known to be equal."""
    if a is None or b is None:
        return False
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.expand(_expr(a) - _expr(b)) == 0


def _at_least(a: Dim, b: Dim) -> bool:
    """Whether ``a >= b`` is known (equal, or e.g. ``seq`` against ``Min(seq, 128)``)."""
    if same(a, b) or (isinstance(b, sympy.Min) and any(same(a, arg) for arg in b.args)):
        return True
    return bool((_expr(a) - _expr(b)).is_nonnegative)


def _expr(dim: Dim) -> sympy.Expr:
    return sympy.Integer(dim) if isinstance(dim, int) else dim


class SymbolicShapes:
    """Dims of every value of ``graph`` and shape values of its small integer tensors (see the module doc).

    Built once, in graph order; rebuild it after changing the graph.
    """

    def __init__(self, graph: ir.Graph) -> None:
        self._fresh = count()
        self._dims: dict[ir.Value, tuple[Dim, ...]] = {}
        self._values: dict[ir.Value, tuple[Dim, ...] | Dim] = {}
        for value in graph.inputs:
            self._dims[value] = self._declared(value)
        for value in graph.initializers.values():
            self._constant(value)
        for node in graph:
            try:
                self._visit(node)
            except (ValueError, IndexError, TypeError, OverflowError, ZeroDivisionError):
                pass  # malformed or unusual attributes: its outputs keep fresh dims
            for out in node.outputs:
                if out not in self._dims:
                    self._dims[out] = self._declared(out)

    # --- queries -------------------------------------------------------------------------

    def dims(self, value: ir.Value | None) -> tuple[Dim, ...] | None:
        """The dims of ``value`` (None: its rank is unknown)."""
        return None if value is None else self._dims.get(value)

    def dim(self, value: ir.Value, axis: int) -> Dim | None:
        dims = self.dims(value)
        if dims is None or not -len(dims) <= axis < len(dims):
            return None
        return dims[axis]

    def shape_value(self, value: ir.Value | None) -> tuple[Dim, ...] | None:
        """The elements of a 1-D integer tensor computed from shapes (None: not known)."""
        found = self._values.get(value) if value is not None else None
        return found if isinstance(found, tuple) else None

    def scalar_value(self, value: ir.Value | None) -> Dim | None:
        found = self._values.get(value) if value is not None else None
        return None if found is None or isinstance(found, tuple) else found

    def update(self, value: ir.Value, dims: Sequence[Dim] | None) -> None:
        """Record ``value``'s dims after a rewrite changed them (a pass keeps one analysis while it rewrites)."""
        if dims is None:
            self._dims.pop(value, None)
        else:
            self._dims[value] = tuple(dims)

    # --- building ------------------------------------------------------------------------

    def fresh(self) -> sympy.Expr:
        return sympy.Symbol(f"_unknown{next(self._fresh)}", integer=True, nonnegative=True)

    def _declared(self, value: ir.Value) -> tuple[Dim, ...] | None:
        """Dims from the value's own shape: ints, named dims; fresh symbols for the rest."""
        if value.shape is None:
            return None
        dims: list[Dim] = []
        for d in value.shape:
            if isinstance(d, int):
                dims.append(d)
            elif value.is_graph_input() and d.value:
                dims.append(named_dim(d.value))
            else:
                dims.append(self.fresh())
        return tuple(dims)

    def _constant(self, value: ir.Value) -> None:
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is None:
            return
        self._dims[value] = tuple(int(d) for d in tensor.shape)
        if tensor.dtype in _INT_TYPES and len(tensor.shape) <= 1 and tensor.size <= MAX_SHAPE_VALUE:
            array = tensor.numpy()
            self._values[value] = int(array) if array.ndim == 0 else tuple(int(x) for x in array)

    def _set(self, value: ir.Value, dims: Sequence[Dim] | None) -> None:
        if dims is None:
            return
        declared = value.shape
        if declared is not None and len(declared) == len(dims):
            # a static size shape inference found is as good as ours
            dims = [d if isinstance(d, int) or not isinstance(s, int) else s for d, s in zip(dims, declared)]
        self._dims[value] = tuple(_simplify(d) for d in dims)

    def _visit(self, node: ir.Node) -> None:
        op = node.op_type
        if node.domain not in ("", "ai.onnx", "com.microsoft"):
            return
        ins = [self.dims(v) for v in node.inputs]
        out = node.outputs[0] if node.outputs else None
        if op == "Constant":
            self._constant(node.outputs[0])
            return
        if op in SAME_SHAPE and ins and ins[0] is not None:
            self._set(out, ins[0])
        elif op in BROADCAST:
            self._set(out, self._broadcast([d for d in ins if d is not None]) if None not in ins else None)
        elif op == "Transpose" and ins[0] is not None:
            perm = node.attributes.get_ints("perm", list(range(len(ins[0]) - 1, -1, -1)))
            self._set(out, [ins[0][p] for p in perm])
        elif op in ("MatMul", "FusedMatMul") and ins[0] is not None and ins[1] is not None:
            self._matmul(node, out, ins[0], ins[1])
        elif op == "Gemm" and ins[0] is not None and ins[1] is not None and len(ins[0]) == len(ins[1]) == 2:
            a, b = ins[0], ins[1]
            self._set(
                out,
                [
                    a[1] if node.attributes.get_int("transA", 0) else a[0],
                    b[0] if node.attributes.get_int("transB", 0) else b[1],
                ],
            )
        elif op == "Reshape":
            self._reshape(node, out, ins[0])
        elif op == "Split" and ins[0] is not None:
            axis = node.attributes.get_int("axis", 0) % len(ins[0])
            sizes = self._ints(node.inputs[1]) if len(node.inputs) > 1 else None
            for i, piece in enumerate(node.outputs):
                dims = list(ins[0])
                dims[axis] = sizes[i] if sizes is not None and i < len(sizes) else self.fresh()
                self._set(piece, dims)
        elif op == "Concat":
            self._concat(node, out, ins)
        elif op == "Gather" and ins[0] is not None and ins[1] is not None:
            axis = node.attributes.get_int("axis", 0) % len(ins[0])
            self._set(out, [*ins[0][:axis], *ins[1], *ins[0][axis + 1 :]])
        elif op in ("Unsqueeze", "Squeeze") and ins[0] is not None:
            self._squeeze(node, out, ins[0])
        elif op == "Slice" and ins[0] is not None:
            self._slice(node, out, ins[0])
        elif op == "Expand" and ins[0] is not None:
            target = self.shape_value(node.inputs[1])
            if target is not None:
                self._set(out, self._broadcast([ins[0], target]))
        elif op == "ConstantOfShape":
            self._constant_of_shape(node, out)
        elif op == "Range":
            self._range(out, *(self.scalar_value(v) for v in node.inputs[:3]))
        elif op == "Tile" and ins[0] is not None:
            repeats = self._ints(node.inputs[1])
            if repeats is not None and len(repeats) == len(ins[0]):
                self._set(out, [_simplify(_expr(d) * r) for d, r in zip(ins[0], repeats)])
        elif op == "Flatten" and ins[0] is not None:
            axis = node.attributes.get_int("axis", 1) % (len(ins[0]) + 1)
            self._set(
                out,
                [_simplify(sympy.Mul(*map(_expr, ins[0][:axis]))), _simplify(sympy.Mul(*map(_expr, ins[0][axis:])))],
            )
        elif (
            op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2") and ins[0] is not None
        ):
            self._reduce(node, out, ins[0])
        elif op == "Shape" and ins[0] is not None:
            rank = len(ins[0])
            start = node.attributes.get_int("start", 0)
            end = node.attributes.get_int("end", rank)
            self._set(out, [len(ins[0][slice(start, end)])])
            self._values[out] = tuple(ins[0][slice(start, end)])
            return
        elif op == "Size" and ins[0] is not None:
            self._set(out, [])
            self._values[out] = _simplify(sympy.Mul(*[_expr(d) for d in ins[0]]))
            return
        self._shape_arithmetic(node, out)

    def _broadcast(self, shapes: list[Sequence[Dim]]) -> list[Dim]:
        """numpy broadcasting; a symbolic dim against another symbolic one is only known when they are equal."""
        rank = max((len(s) for s in shapes), default=0)
        result: list[Dim] = []
        for axis in range(rank):
            present = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
            sizes = [d for d in present if not (is_int(d) and as_int(d) == 1)]
            if not sizes:
                result.append(1)
                continue
            statics = [as_int(d) for d in sizes if is_int(d)]
            # sizes that broadcast are equal or 1, so the result is the largest: a static size
            # (the others must be 1 or equal to it), or one known to be >= every other
            largest = [d for d in sizes if all(_at_least(d, e) for e in sizes)]
            result.append(statics[0] if statics else largest[0] if largest else self.fresh())
        return result

    def _matmul(self, node: ir.Node, out: ir.Value, a: Sequence[Dim], b: Sequence[Dim]) -> None:
        if len(a) < 2 or len(b) < 2:
            return
        trans_a = node.op_type == "FusedMatMul" and node.attributes.get_int("transA", 0)
        trans_b = node.op_type == "FusedMatMul" and node.attributes.get_int("transB", 0)
        rows = a[-1] if trans_a else a[-2]
        cols = b[-2] if trans_b else b[-1]
        self._set(out, [*self._broadcast([a[:-2], b[:-2]]), rows, cols])

    def _reshape(self, node: ir.Node, out: ir.Value, data: Sequence[Dim] | None) -> None:
        target = self.shape_value(node.inputs[1])
        if target is None:
            return
        allow_zero = node.attributes.get_int("allowzero", 0)
        dims: list[Dim | None] = []
        for i, t in enumerate(target):
            if is_int(t) and as_int(t) == 0 and not allow_zero:
                dims.append(data[i] if data is not None and i < len(data) else self.fresh())
            elif is_int(t) and as_int(t) == -1:
                dims.append(None)
            else:
                dims.append(t)
        if None in dims:
            i = dims.index(None)
            # [.., -1, ..] where every other dim copies the input's at the same place: -1 is the input's dim there
            copies = (
                data is not None
                and len(data) == len(dims)
                and all(j == i or same(d, data[j]) for j, d in enumerate(dims))
            )
            dims[i] = data[i] if copies else self._inferred(data, dims)
        self._set(out, dims)

    def _inferred(self, data: Sequence[Dim] | None, dims: list[Dim | None]) -> Dim:
        """The size a Reshape's -1 stands for: the input's size over the others', when that divides exactly."""
        known_dims = [d for d in dims if d is not None]
        if data is None or any(is_int(d) and as_int(d) == 0 for d in known_dims):
            return self.fresh()
        total = sympy.Mul(*[_expr(d) for d in data])
        known = sympy.Mul(*[_expr(d) for d in known_dims])
        quotient = sympy.cancel(total / known)
        return quotient if quotient.is_polynomial() and sympy.fraction(quotient)[1] == 1 else self.fresh()

    def _concat(self, node: ir.Node, out: ir.Value, ins: list) -> None:
        if not ins or any(d is None for d in ins):
            return
        rank = len(ins[0])
        axis = node.attributes.get_int("axis", 0) % max(rank, 1)
        dims: list[Dim] = []
        for i in range(rank):
            column = [d[i] for d in ins]
            if i == axis:
                dims.append(_simplify(sympy.Add(*[_expr(d) for d in column])))
            else:
                statics = [d for d in column if is_int(d)]
                dims.append(statics[0] if statics else column[0])  # all equal by Concat's contract
        self._set(out, dims)

    def _squeeze(self, node: ir.Node, out: ir.Value, data: Sequence[Dim]) -> None:
        axes = self._ints(node.inputs[1]) if len(node.inputs) > 1 else node.attributes.get_ints("axes", None)
        if node.op_type == "Unsqueeze":
            if axes is None:
                return
            rank = len(data) + len(axes)
            axes = sorted(a % rank for a in axes)
            dims, rest = [], iter(data)
            for i in range(rank):
                dims.append(1 if i in axes else next(rest))
            self._set(out, dims)
        else:
            if axes is None:
                if not all(is_int(d) for d in data):
                    return
                axes = [i for i, d in enumerate(data) if as_int(d) == 1]
            axes = {a % len(data) for a in axes}
            self._set(out, [d for i, d in enumerate(data) if i not in axes])

    def _slice(self, node: ir.Node, out: ir.Value, data: Sequence[Dim]) -> None:
        starts, ends = self._ints(node.inputs[1]), self.shape_value(node.inputs[2])
        axes = self._ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
        steps = self._ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else None
        if starts is None or ends is None:
            sliced = set(range(len(data))) if axes is None else {a % len(data) for a in axes}
            self._set(out, [self.fresh() if i in sliced else d for i, d in enumerate(data)])
            return
        axes = list(range(len(starts))) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        dims = list(data)
        for start, end, axis, step in zip(starts, ends, axes, steps):
            axis %= len(data)
            size = dims[axis]
            if is_int(end) and step == 1 and start == 0 and as_int(end) >= 2**31 - 1:
                continue  # the whole axis
            if is_int(size) and is_int(end):
                dims[axis] = len(range(*slice(start, as_int(end), step).indices(as_int(size))))
            elif start == 0 and step == 1 and not is_int(end) and _expr(end).is_nonnegative:
                dims[axis] = _simplify(sympy.Min(_expr(end), _expr(size)))  # [:end], clamped to the axis
            else:
                dims[axis] = self.fresh()
        self._set(out, dims)

    def _constant_of_shape(self, node: ir.Node, out: ir.Value) -> None:
        target = self.shape_value(node.inputs[0])
        if target is None:
            return
        self._set(out, target)
        fill = node.attributes.get("value")
        fill = fill.value.numpy() if fill is not None else np.zeros(1, np.float32)
        if len(target) == 1 and is_int(target[0]) and as_int(target[0]) <= MAX_SHAPE_VALUE and fill.dtype.kind in "iu":
            self._values[out] = tuple(int(fill.reshape(-1)[0]) for _ in range(as_int(target[0])))

    def _range(self, out: ir.Value, start: Dim | None, limit: Dim | None, delta: Dim | None) -> None:
        if start is None or limit is None or delta is None or not is_int(delta) or as_int(delta) == 0:
            return
        if as_int(delta) == 1:
            self._set(out, [_simplify(sympy.Max(_expr(limit) - _expr(start), 0))])
        elif is_int(start) and is_int(limit):
            self._set(out, [len(range(as_int(start), as_int(limit), as_int(delta)))])

    def _reduce(self, node: ir.Node, out: ir.Value, data: Sequence[Dim]) -> None:
        axes = self._ints(node.inputs[1]) if len(node.inputs) > 1 else node.attributes.get_ints("axes", None)
        if axes is None:
            axes = list(range(len(data)))
        axes = {a % len(data) for a in axes}
        keep = node.attributes.get_int("keepdims", 1)
        self._set(
            out,
            [1 if i in axes else d for i, d in enumerate(data)]
            if keep
            else [d for i, d in enumerate(data) if i not in axes],
        )

    def _ints(self, value: ir.Value | None) -> list[int] | None:
        """A constant (or fully known) 1-D integer tensor as ints."""
        found = self.shape_value(value)
        if found is None or not all(is_int(d) for d in found):
            return None
        return [as_int(d) for d in found]

    # --- shape values --------------------------------------------------------------------

    def _shape_arithmetic(self, node: ir.Node, out: ir.Value | None) -> None:
        """Shape values through the ops exporters compute shapes with."""
        if out is None or out in self._values:
            return
        op = node.op_type
        first = self._values.get(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
        if op in ("Identity", "Cast") and first is not None:
            if op == "Identity" or node.attributes.get_int("to", 0) in (ir.DataType.INT64, ir.DataType.INT32):
                self._values[out] = first
        elif op == "Gather" and isinstance(first, tuple) and node.attributes.get_int("axis", 0) == 0:
            index = self._values.get(node.inputs[1])
            if isinstance(index, tuple):
                picked = [first[_index(i, len(first))] for i in index]
                self._values[out] = tuple(picked)
            elif index is not None and is_int(index):
                self._values[out] = first[_index(index, len(first))]
        elif op == "Unsqueeze" and first is not None and not isinstance(first, tuple):
            self._values[out] = (first,)
        elif op == "Squeeze" and isinstance(first, tuple) and len(first) == 1:
            self._values[out] = first[0]
        elif op == "Reshape" and first is not None:
            elements = first if isinstance(first, tuple) else (first,)
            target = self._ints(node.inputs[1])
            if target is not None and len(target) == 1 and target[0] in (-1, len(elements)):
                self._values[out] = tuple(elements)
            elif target == [] and len(elements) == 1:
                self._values[out] = elements[0]
        elif op == "Concat" and node.attributes.get_int("axis", 0) in (0, -1):
            pieces = [self._values.get(v) for v in node.inputs]
            if all(isinstance(p, tuple) for p in pieces):
                self._values[out] = tuple(d for p in pieces for d in p)
        elif op == "Slice" and isinstance(first, tuple):
            starts, ends = self._ints(node.inputs[1]), self._ints(node.inputs[2])
            axes = self._ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
            steps = self._ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
            if starts and ends and len(starts) == 1 and axes in ([0], [-1]) and steps and steps[0] != 0:
                self._values[out] = first[slice(starts[0], ends[0], steps[0])]
        elif op in ("Add", "Sub", "Mul", "Div", "Equal") and len(node.inputs) == 2:
            self._elementwise(op, out, first, self._values.get(node.inputs[1]))
        elif op == "Where" and len(node.inputs) == 3:
            self._where(out, first, self._values.get(node.inputs[1]), self._values.get(node.inputs[2]))
        if out in self._values and isinstance(self._values[out], tuple):
            self._set(out, [len(self._values[out])])

    def _elementwise(self, op: str, out: ir.Value, a, b) -> None:
        if a is None or b is None:
            return
        scalar = not isinstance(a, tuple) and not isinstance(b, tuple)
        xs = a if isinstance(a, tuple) else (a,)
        ys = b if isinstance(b, tuple) else (b,)
        if len(xs) != len(ys) and 1 not in (len(xs), len(ys)):
            return
        n = max(len(xs), len(ys))
        xs, ys = xs * (n if len(xs) == 1 else 1), ys * (n if len(ys) == 1 else 1)
        result = []
        for x, y in zip(xs, ys):
            x, y = _expr(x), _expr(y)
            if op == "Add":
                r = x + y
            elif op == "Sub":
                r = x - y
            elif op == "Mul":
                r = x * y
            elif op == "Equal":
                known = (x - y).is_zero
                if known is None:
                    return
                r = sympy.Integer(int(known))
            elif x.is_Integer and y.is_Integer and y != 0:
                r = sympy.Integer(int(np.trunc(int(x) / int(y))) if (int(x) < 0) != (int(y) < 0) else int(x) // int(y))
            else:
                return  # symbolic division: not needed so far, and floor/trunc differ
            result.append(_simplify(r))
        self._values[out] = result[0] if scalar else tuple(result)

    def _where(self, out: ir.Value, condition, a, b) -> None:
        """Where over shape values: decidable when every condition is (Equal of a dim and -1, say)."""
        if condition is None or a is None or b is None:
            return
        parts = [p if isinstance(p, tuple) else (p,) for p in (condition, a, b)]
        n = max(len(p) for p in parts)
        if any(len(p) not in (1, n) for p in parts):
            return
        c, x, y = (p * n if len(p) == 1 else p for p in parts)
        picked = tuple(xi if as_int(ci) else yi for ci, xi, yi in zip(c, x, y))
        self._values[out] = picked if any(isinstance(p, tuple) for p in (condition, a, b)) else picked[0]


def _index(i: Dim, length: int) -> int:
    i = as_int(i)
    if not -length <= i < length:
        raise IndexError(i)
    return i % length


def _simplify(dim: Dim) -> Dim:
    if isinstance(dim, int):
        return dim
    dim = sympy.expand(dim)
    return int(dim) if dim.is_Integer else dim
