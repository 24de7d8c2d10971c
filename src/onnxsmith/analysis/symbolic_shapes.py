"""The symbolic-shape engine: what every value of a graph is, in terms of the model's input dims.

Exporters compute shapes at run time: a Reshape's target comes from ``Shape`` ->
``Gather`` -> ``Unsqueeze`` -> ``Concat`` chains, a ViT's position table from the
image's height and width through ``Range``, ``Tile`` and ``If``, a detector's upsampling
sizes from a feature map's ``Shape``. To replace any of that by a constant, or to drop
a Reshape pair, a pass must know what it computes for *every* size of the free input
dims, not for the sizes it happened to be run at. This module tells it, soundly: when
it is not sure, it says "unknown".

For every value it says (:meth:`SymbolicShapes.fact`):

* **constant**: the value depends neither on the input data nor on any free input dim
  (what it reads are constants and the *fixed* sizes of shapes): it is the same at every
  size, and a pass may replace it by its value;
* **expression**: a small integer tensor computed from shapes whose elements are known
  as expressions in the input dims (``[batch, 196, 768]``, ``[batch, floor(height/32)]``);
* **unknown**: anything else (it reads the data, or a size the analysis cannot express).

Dims and shape values are :class:`onnx_ir.SymbolicDim` expressions (sympy underneath, as
onnx-ir's own symbolic dims are) over the graph inputs' named dims; a dim the analysis
cannot relate to them is a fresh symbol, so an expression holding one never equals
anything it was not derived from. Two axes get equal dims only when the graph
guarantees they are equal: the same named input dim, an elementwise op that cannot
broadcast on that axis, a Transpose, a MatMul's rows, a Reshape that copies a dim, a
convolution's output size formula, ... Declared shapes (the exporter's value_info, or
onnx's inference) fill in dims the analysis has no rule for, never override one it derived.

Only the main graph is analysed, in graph order (ONNX graphs are topologically sorted);
what a subgraph computes gives fresh dims, but a node with subgraphs is still a
*constant* when everything it and its subgraphs read is.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count

import numpy as np
import onnx_ir as ir
import sympy

from onnxsmith.irutil.walk import captured, subgraphs_of

Dim = int | sympy.Expr

#: Integer tensors longer than this are not shape values.
MAX_SHAPE_VALUE = 16
#: The prefix of fresh symbols: a dim nobody can relate to the input dims.
UNKNOWN_PREFIX = "_unknown"

#: Ops whose first output has the shape of their first input.
SAME_SHAPE = frozenset(
    {
        "Identity",
        "Cast",
        "CastLike",
        "Relu",
        "LeakyRelu",
        "PRelu",
        "Elu",
        "Selu",
        "Celu",
        "Gelu",
        "Tanh",
        "Sigmoid",
        "HardSigmoid",
        "Softplus",
        "Softsign",
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
        "Hardmax",
        "Clip",
        "Dropout",
        "LayerNormalization",
        "RMSNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "BatchNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "LpNormalization",
        "MeanVarianceNormalization",
        "LRN",
        "FastGelu",
        "QuickGelu",
        "BiasGelu",
        "Trilu",
        "CumSum",
        "Mish",
        "HardSwish",
        "Swish",
        "ThresholdedRelu",
        "Shrink",
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
    }
)
#: Sliding windows over the spatial axes (2..): output size from kernel, stride, pads, dilation.
WINDOWED = frozenset({"Conv", "MaxPool", "AveragePool", "LpPool", "ConvInteger", "QLinearConv"})
GLOBAL_POOL = frozenset({"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
#: Ops whose results differ from run to run: never constant.
NONDETERMINISTIC = frozenset(
    {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial", "Bernoulli"}
)
_INT_TYPES = frozenset({ir.DataType.INT64, ir.DataType.INT32})
#: Constants whose elements are known as shape values: integers, and booleans as 0/1 (how Equal of shape values
#: comes out here), so a Where whose condition an earlier fold made constant still selects known elements.
_VALUE_TYPES = _INT_TYPES | {ir.DataType.BOOL}
#: What a value depends on besides input dims: the input data, or something the analysis cannot name.
DATA = "<data>"
UNKNOWN = "<unknown>"


class Kind(enum.Enum):
    CONSTANT = "constant"
    EXPRESSION = "expression"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Fact:
    """What the engine knows about one value (:meth:`SymbolicShapes.fact`)."""

    kind: Kind
    #: Its dims (None: rank unknown): ints and SymbolicDims; an unknown dim is ``SymbolicDim(None)``.
    shape: ir.Shape | None
    #: A shape value's elements (ints and SymbolicDims), when known.
    elements: tuple[int | ir.SymbolicDim, ...] | None
    #: The free input dims it depends on (names), plus DATA / UNKNOWN.
    depends_on: frozenset[str]


def named_dim(text: str) -> sympy.Expr:
    """A declared dim: a name, or an expression of names as exporters (and this engine) write them
    ('past_sequence_length + 1', 'floor(height/2 - 1/2) + 1'), parsed without eval; anything else is one
    opaque dim."""
    try:
        expr = _parse(ast.parse(text, mode="eval").body) if len(text) <= _MAX_EXPRESSION else None
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, RecursionError):
        expr = None
    return expr if isinstance(expr, sympy.Expr) and expr.free_symbols else _symbol(text)  # a number is no name


#: Longer dim texts are names, not expressions.
_MAX_EXPRESSION = 200
_FUNCTIONS = {
    "floor": sympy.floor,
    "ceil": sympy.ceiling,
    "ceiling": sympy.ceiling,
    "max": sympy.Max,
    "Max": sympy.Max,
    "min": sympy.Min,
    "Min": sympy.Min,
    "Mod": sympy.Mod,
}
_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: sympy.floor(a / b),
    ast.Mod: sympy.Mod,
}


def _parse(node: ast.expr) -> sympy.Expr:
    """Integer dim arithmetic from a Python expression tree: names, ints, + - * / // %, floor/ceil/max/min."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return sympy.Integer(node.value)
    if isinstance(node, ast.Name):
        return _symbol(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _parse(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_parse(node.left), _parse(node.right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords or not node.args:
            raise ValueError("not a dim expression")
        return _FUNCTIONS[node.func.id](*(_parse(a) for a in node.args))
    raise ValueError("not a dim expression")


def _symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


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


def is_unknown(dim: Dim) -> bool:
    """Whether a dim holds a fresh symbol (a size the analysis cannot relate to the input dims)."""
    return isinstance(dim, sympy.Expr) and any(s.name.startswith(UNKNOWN_PREFIX) for s in dim.free_symbols)


def to_symbolic_dim(dim: Dim) -> int | ir.SymbolicDim:
    """A dim as onnx-ir writes one: an int, or a SymbolicDim of the expression (None when unknown)."""
    if is_int(dim):
        return as_int(dim)
    return ir.SymbolicDim(None) if is_unknown(dim) else ir.SymbolicDim(dim)


def _at_least(a: Dim, b: Dim) -> bool:
    """Whether ``a >= b`` is known (equal, or e.g. ``seq`` against ``Min(seq, 128)``)."""
    if same(a, b) or (isinstance(b, sympy.Min) and any(same(a, arg) for arg in b.args)):
        return True
    return bool((_expr(a) - _expr(b)).is_nonnegative)


def _expr(dim: Dim) -> sympy.Expr:
    return sympy.Integer(dim) if isinstance(dim, int) else dim


class SymbolicShapes:
    """Dims, shape values and facts of every value of ``graph`` (see the module doc).

    Built once, in graph order; rebuild it after changing the graph (or :meth:`update` what changed).
    """

    def __init__(self, graph: ir.Graph) -> None:
        self._fresh = count()
        self._dims: dict[ir.Value, tuple[Dim, ...]] = {}
        self._values: dict[ir.Value, tuple[Dim, ...] | Dim] = {}
        self._deps: dict[ir.Value, frozenset[str]] = {}
        self._inputs = {
            str(s)
            for v in graph.inputs
            if v.shape is not None and not v.is_initializer()
            for d in v.shape
            if not isinstance(d, int) and d.value
            for s in named_dim(d.value).free_symbols
        }
        for value in graph.inputs:
            self._dims[value] = self._declared(value, trusted=True)
            self._deps[value] = frozenset() if value.is_initializer() else frozenset({DATA})
        for value in graph.initializers.values():
            self._constant(value)
        for node in graph:
            try:
                self._visit(node)
            except (ValueError, IndexError, TypeError, OverflowError, ZeroDivisionError, AttributeError):
                pass  # malformed or unusual attributes: its outputs keep fresh dims
            for out in node.outputs:
                if out not in self._dims:
                    self._dims[out] = self._declared(out)
            self._depend(node)

    # --- queries -------------------------------------------------------------------------

    def dims(self, value: ir.Value | None) -> tuple[Dim, ...] | None:
        """The dims of ``value`` (None: its rank is unknown)."""
        return None if value is None else self._dims.get(value)

    def dim(self, value: ir.Value, axis: int) -> Dim | None:
        dims = self.dims(value)
        if dims is None or not -len(dims) <= axis < len(dims):
            return None
        return dims[axis]

    def shape(self, value: ir.Value | None) -> ir.Shape | None:
        """The dims of ``value`` as onnx-ir writes a shape (ints, SymbolicDims; None: rank unknown)."""
        dims = self.dims(value)
        return None if dims is None else ir.Shape([to_symbolic_dim(d) for d in dims])

    def shape_value(self, value: ir.Value | None) -> tuple[Dim, ...] | None:
        """The elements of a 1-D integer tensor computed from shapes (None: not known)."""
        found = self._values.get(value) if value is not None else None
        return found if isinstance(found, tuple) else None

    def scalar_value(self, value: ir.Value | None) -> Dim | None:
        found = self._values.get(value) if value is not None else None
        return None if found is None or isinstance(found, tuple) else found

    def literal(self, value: ir.Value | None) -> np.ndarray | None:
        """The value of a shape value whose elements are all ints (an int64 array; 0-d for a scalar)."""
        found = self._values.get(value) if value is not None else None
        if found is None:
            return None
        elements = found if isinstance(found, tuple) else (found,)
        if not all(is_int(e) for e in elements):
            return None
        array = np.array([as_int(e) for e in elements], np.int64)
        return array if isinstance(found, tuple) else array.reshape(())

    def depends_on(self, value: ir.Value | None) -> frozenset[str]:
        """The free input dims ``value`` depends on (names), and DATA / UNKNOWN when it does on those."""
        if value is None:
            return frozenset()
        return self._deps.get(value, frozenset({UNKNOWN}))

    def is_constant(self, value: ir.Value | None) -> bool:
        """Whether ``value`` is the same at every size of the free input dims and for any input data."""
        return value is not None and not value.is_graph_input() and not self.depends_on(value)

    def fact(self, value: ir.Value) -> Fact:
        elements = self._values.get(value)
        if elements is not None:
            elements = tuple(to_symbolic_dim(e) for e in (elements if isinstance(elements, tuple) else (elements,)))
        if self.is_constant(value):
            kind = Kind.CONSTANT
        elif elements is not None and all(isinstance(e, int) or e.value is not None for e in elements):
            kind = Kind.EXPRESSION
        else:
            kind = Kind.UNKNOWN
        return Fact(kind, self.shape(value), elements, self.depends_on(value))

    def update(self, value: ir.Value, dims: Sequence[Dim] | None) -> None:
        """Record ``value``'s dims after a rewrite changed them (a pass keeps one analysis while it rewrites)."""
        if dims is None:
            self._dims.pop(value, None)
        else:
            self._dims[value] = tuple(dims)

    # --- building ------------------------------------------------------------------------

    def fresh(self) -> sympy.Expr:
        return _symbol(f"{UNKNOWN_PREFIX}{next(self._fresh)}")

    def _declared(self, value: ir.Value, *, trusted: bool = False) -> tuple[Dim, ...] | None:
        """Dims from the value's own shape: ints, named dims; fresh symbols for the rest.

        A graph input's names are the input dims (``trusted``); elsewhere a declared name is
        taken only when it is an expression in those (an exporter's symbolic inference writes
        'floor(height/2 - 1/2) + 1'), never an ``unk__3`` of onnx's own. A negative size (-1,
        as some exporters write a free dim) is no size.
        """
        if value.shape is None:
            return None
        dims: list[Dim] = []
        for d in value.shape:
            if isinstance(d, int):
                dims.append(d if d >= 0 else self.fresh())
                continue
            expr = named_dim(d.value) if d.value else None
            if expr is not None and (trusted or {str(s) for s in expr.free_symbols} <= self._inputs):
                dims.append(_simplify(expr))
            else:
                dims.append(self.fresh())
        return tuple(dims)

    def _constant(self, value: ir.Value) -> None:
        self._deps[value] = frozenset()
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is None:
            return
        self._dims[value] = tuple(int(d) for d in tensor.shape)
        if tensor.dtype in _VALUE_TYPES and len(tensor.shape) <= 1 and tensor.size <= MAX_SHAPE_VALUE:
            array = tensor.numpy()
            self._values[value] = int(array) if array.ndim == 0 else tuple(int(x) for x in array)

    def _set(self, value: ir.Value, dims: Sequence[Dim] | None) -> None:
        if dims is None:
            return
        declared = self._declared(value)
        if declared is not None and len(declared) == len(dims):
            # what the declaration knows fills in what the analysis does not (never the other way round)
            dims = [s if is_unknown(d) and not is_unknown(s) else d for d, s in zip(dims, declared)]
        self._dims[value] = tuple(_simplify(d) for d in dims)

    def _depend(self, node: ir.Node) -> None:
        """What each output depends on: what the node reads, and for a shape value also what its elements hold.

        Both are sound (they name every input dim the value could change with), so the value
        depends on no more than what both name: ``Gather(Shape(x), 2)`` reads ``x``'s batch but
        holds its fixed height; ``Shape`` of a constant is constant whatever its dims are called.
        """
        if node.op_type in NONDETERMINISTIC:
            reads = frozenset({UNKNOWN})
        elif node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
            # the dims of what it reads: known only for a constant (else from its elements, below)
            reads = frozenset() if self.is_constant(node.inputs[0]) else frozenset({UNKNOWN})
        else:
            reads = frozenset().union(
                *(self.depends_on(v) for v in node.inputs if v is not None),
                *(self.depends_on(v) for sub in subgraphs_of(node) for v in captured(sub)),
            )
        for out in node.outputs:
            if out in self._deps:  # a Constant
                continue
            found = self._values.get(out)
            if found is not None:
                elements = found if isinstance(found, tuple) else (found,)
                self._deps[out] = _meet(reads, frozenset().union(*(_dim_dependencies(e) for e in elements)))
            else:
                self._deps[out] = reads

    def _visit(self, node: ir.Node) -> None:
        if node.domain not in ("", "ai.onnx", "com.microsoft"):
            return
        if node.op_type == "Constant":
            self._constant(node.outputs[0])
            return
        ins = [self.dims(v) for v in node.inputs]
        out = node.outputs[0] if node.outputs else None
        known, rule = _SHAPE_RULES.get(node.op_type, (0, None))
        applies = rule is not None and len(ins) >= known and all(d is not None for d in ins[:known])
        if applies and rule(self, node, out, ins) is _VALUES_SET:
            return  # the output's values are known: no shape arithmetic to evaluate
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

    def _windowed(self, node: ir.Node, out: ir.Value, data: Sequence[Dim], weight: Sequence[Dim] | None) -> None:
        """Conv / pooling: each spatial size from the window, the strides, the pads and the dilations."""
        spatial = len(data) - 2
        if spatial < 1:
            return
        is_conv = node.op_type in ("Conv", "ConvInteger", "QLinearConv")
        if node.op_type == "QLinearConv":
            weight = self.dims(node.inputs[3]) if len(node.inputs) > 3 else None
        kernel = node.attributes.get_ints("kernel_shape", None)
        if kernel is None and is_conv and weight is not None and all(is_int(d) for d in weight[2:]):
            kernel = [as_int(d) for d in weight[2:]]
        if kernel is None or len(kernel) != spatial:
            return
        strides = node.attributes.get_ints("strides", [1] * spatial)
        dilations = node.attributes.get_ints("dilations", [1] * spatial)
        pads = node.attributes.get_ints("pads", [0] * (2 * spatial))
        auto_pad = node.attributes.get_string("auto_pad", "NOTSET")
        ceil_mode = node.attributes.get_int("ceil_mode", 0)
        sizes = []
        for i, size in enumerate(data[2:]):
            window = dilations[i] * (kernel[i] - 1) + 1
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                sizes.append(_ceil_div(_expr(size), strides[i]))
            elif auto_pad == "VALID":
                sizes.append(_ceil_div(_expr(size) - window + 1, strides[i]))
            else:
                span = _expr(size) + pads[i] + pads[i + spatial] - window
                rounded = _ceil_div(span, strides[i]) if ceil_mode else _floor_div(span, strides[i])
                sizes.append(rounded + 1)
        channels = (weight[0] if weight is not None else self.fresh()) if is_conv else data[1]
        self._set(out, [data[0], channels, *sizes])

    def _conv_transpose(self, node: ir.Node, out: ir.Value, data: Sequence[Dim], weight: Sequence[Dim] | None) -> None:
        spatial = len(data) - 2
        if spatial < 1 or weight is None or len(weight) != len(data):
            return
        if node.attributes.get_ints("output_shape", None) is not None:
            return  # rare; onnx's inference says
        kernel = node.attributes.get_ints("kernel_shape", None)
        if kernel is None and all(is_int(d) for d in weight[2:]):
            kernel = [as_int(d) for d in weight[2:]]
        if kernel is None or node.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
            return
        strides = node.attributes.get_ints("strides", [1] * spatial)
        dilations = node.attributes.get_ints("dilations", [1] * spatial)
        pads = node.attributes.get_ints("pads", [0] * (2 * spatial))
        extra = node.attributes.get_ints("output_padding", [0] * spatial)
        group = node.attributes.get_int("group", 1)
        sizes = [
            strides[i] * (_expr(size) - 1) + extra[i] + dilations[i] * (kernel[i] - 1) + 1 - pads[i] - pads[i + spatial]
            for i, size in enumerate(data[2:])
        ]
        channels = _expr(weight[1]) * group
        self._set(out, [data[0], channels, *sizes])

    def _resize(self, node: ir.Node, out: ir.Value, data: Sequence[Dim]) -> None:
        """Resize / Upsample: sizes given, or each dim times its scale, floored."""
        if node.op_type == "Upsample" or len(node.inputs) == 2:  # Upsample, Resize-10: (X, scales)
            scales = node.attributes.get_floats("scales", None)
            if scales is None and len(node.inputs) > 1:
                scales = _floats(node.inputs[1])
            sizes = None
        else:
            scales = _floats(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
            sizes = self.shape_value(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
        if node.attributes.get_ints("axes", None) is not None:
            return  # opset 18's partial axes: onnx's inference says
        if sizes is not None and len(sizes) == len(data):
            self._set(out, list(sizes))
        elif scales is not None and len(scales) == len(data):
            self._set(out, [sympy.floor(_expr(d) * sympy.Rational(s)) for d, s in zip(data, scales)])

    def _pad(self, node: ir.Node, out: ir.Value, data: Sequence[Dim]) -> None:
        pads = node.attributes.get_ints("pads", None)
        if pads is None and len(node.inputs) > 1:
            pads = self._ints(node.inputs[1])
        if pads is None or len(pads) % 2:
            return
        axes = self._ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
        axes = list(range(len(data))) if axes is None else [a % len(data) for a in axes]
        if len(pads) != 2 * len(axes):
            return
        dims = list(data)
        for i, axis in enumerate(axes):
            dims[axis] = _expr(dims[axis]) + pads[i] + pads[i + len(axes)]
        self._set(out, dims)

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

    def _split(self, node: ir.Node, data: Sequence[Dim]) -> None:
        axis = node.attributes.get_int("axis", 0) % len(data)
        sizes = self._ints(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        sizes = node.attributes.get_ints("split", sizes)
        pieces = len(node.outputs)
        if sizes is None and is_int(data[axis]) and as_int(data[axis]) % pieces == 0:
            sizes = [as_int(data[axis]) // pieces] * pieces
        for i, piece in enumerate(node.outputs):
            dims = list(data)
            dims[axis] = sizes[i] if sizes is not None and i < len(sizes) else self.fresh()
            self._set(piece, dims)

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
                known = [d for d in column if not is_unknown(d)]
                dims.append(statics[0] if statics else known[0] if known else column[0])  # all equal by contract
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
        if len(node.inputs) < 3:  # opset < 10: starts/ends/axes are attributes
            starts, ends = node.attributes.get_ints("starts", None), node.attributes.get_ints("ends", None)
            axes, steps = node.attributes.get_ints("axes", None), None
        else:
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
            elif step == 1 and start >= 0 and is_int(end) and as_int(end) >= 2**31 - 1:
                dims[axis] = _simplify(sympy.Max(_expr(size) - start, 0))  # [start:]
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
            if node.attributes.get_int("noop_with_empty_axes", 0):
                self._set(out, data)
                return
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
        first = self._values.get(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
        rule = _VALUE_RULES.get(node.op_type)
        value = rule(self, node, first) if rule is not None else None
        if value is not None:
            self._values[out] = value
        if out in self._values and isinstance(self._values[out], tuple):
            self._set(out, [len(self._values[out])])

    def _elementwise(self, op: str, a, b) -> object:
        if a is None or b is None:
            return None
        scalar = not isinstance(a, tuple) and not isinstance(b, tuple)
        xs = a if isinstance(a, tuple) else (a,)
        ys = b if isinstance(b, tuple) else (b,)
        if len(xs) != len(ys) and 1 not in (len(xs), len(ys)):
            return None
        n = max(len(xs), len(ys))
        xs, ys = xs * (n if len(xs) == 1 else 1), ys * (n if len(ys) == 1 else 1)
        result = []
        for x, y in zip(xs, ys):
            r = _arithmetic(op, _expr(x), _expr(y))
            if r is None:
                return None
            result.append(_simplify(r))
        return result[0] if scalar else tuple(result)

    def _where(self, condition, a, b) -> object:
        """Where over shape values: decidable when every condition is (Equal of a dim and -1, say)."""
        if condition is None or a is None or b is None:
            return None
        parts = [p if isinstance(p, tuple) else (p,) for p in (condition, a, b)]
        n = max(len(p) for p in parts)
        if any(len(p) not in (1, n) for p in parts):
            return None
        c, x, y = (p * n if len(p) == 1 else p for p in parts)
        if not all(is_int(ci) for ci in c):
            return None
        picked = tuple(xi if as_int(ci) else yi for ci, xi, yi in zip(c, x, y))
        return picked if any(isinstance(p, tuple) for p in (condition, a, b)) else picked[0]


def _arithmetic(op: str, x: sympy.Expr, y: sympy.Expr) -> sympy.Expr | None:
    """One element of integer shape arithmetic, or None when it is not certain."""
    if op == "Add":
        return x + y
    if op == "Sub":
        return x - y
    if op == "Mul":
        return x * y
    if op == "Max":
        return sympy.Max(x, y)
    if op == "Min":
        return sympy.Min(x, y)
    if op == "Equal":
        known = sympy.Eq(x, y)
        if known is sympy.true:
            return sympy.Integer(1)
        if known is sympy.false or (x - y).is_nonzero:
            return sympy.Integer(0)
        return None
    if not (y.is_Integer and y != 0):
        return None  # division by a size: not needed so far
    if x.is_Integer:  # ONNX's integer Div truncates toward zero, its Mod (fmod=0) takes the divisor's sign
        if op == "Div":
            return sympy.Integer(int(np.trunc(int(x) / int(y))) if (int(x) < 0) != (int(y) < 0) else int(x) // int(y))
        return sympy.Integer(int(x) % int(y))
    if x.is_nonnegative and y > 0:  # a size over a positive constant: truncation is floor
        return _floor_div(x, int(y)) if op == "Div" else sympy.Mod(x, int(y))
    return None


def _floor_div(x: sympy.Expr, d: int) -> sympy.Expr:
    """floor(x / d) for an integer x and d > 0; floors of floors as one (floor(floor(n/a)/b) = floor(n/(a*b)))."""
    if d == 1:
        return x
    numerator, denominator = _as_floor(sympy.expand(x))
    return sympy.floor(numerator / (denominator * d))


def _ceil_div(x: sympy.Expr, d: int) -> sympy.Expr:
    return _floor_div(x + d - 1, d)  # ceil(x/d) = floor((x + d - 1)/d) for integers


def _as_floor(x: sympy.Expr) -> tuple[sympy.Expr, int]:
    """(n, q) with x == floor(n/q): x itself (q = 1), or x = floor(p/q) + c with an integer c -> floor((p + c*q)/q)."""
    terms = sympy.Add.make_args(x)
    floors = [t for t in terms if isinstance(t, sympy.floor)]
    rest = sympy.Add(*[t for t in terms if not isinstance(t, sympy.floor)])
    if len(floors) == 1 and rest.is_Integer:
        numerator, denominator = sympy.fraction(sympy.together(floors[0].args[0]))
        if denominator.is_Integer and denominator > 0 and numerator.is_integer:
            return sympy.expand(numerator + rest * denominator), int(denominator)
    return x, 1


def _floats(value: ir.Value | None) -> list[float] | None:
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    if tensor is None or tensor.size == 0:
        return None
    return [float(x) for x in tensor.numpy().reshape(-1)]


def _meet(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """What a value depends on when both ``a`` and ``b`` are sound: DATA and UNKNOWN stand for everything."""
    if a & {DATA, UNKNOWN}:
        return b
    if b & {DATA, UNKNOWN}:
        return a
    return a & b


def _dim_dependencies(dim: Dim) -> frozenset[str]:
    """The input dims one element depends on; UNKNOWN for a fresh symbol."""
    if is_int(dim):
        return frozenset()
    return frozenset(UNKNOWN if s.name.startswith(UNKNOWN_PREFIX) else s.name for s in dim.free_symbols)


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


# ---- the shape rules, one per op: (the leading inputs whose dims must be known, the rule) ---------------------------
# A rule is (engine, node, its first output, the dims of its inputs) -> None, or _VALUES_SET when it set the output's
# values too (Shape, Size), so no shape arithmetic is evaluated for it.

_VALUES_SET = object()


def _gemm(e: SymbolicShapes, node: ir.Node, out, ins) -> None:
    a, b = ins[0], ins[1]
    if len(a) == len(b) == 2:
        e._set(
            out,
            [
                a[1] if node.attributes.get_int("transA", 0) else a[0],
                b[0] if node.attributes.get_int("transB", 0) else b[1],
            ],
        )


def _transpose(e: SymbolicShapes, node: ir.Node, out, ins) -> None:
    perm = node.attributes.get_ints("perm", list(range(len(ins[0]) - 1, -1, -1)))
    e._set(out, [ins[0][p] for p in perm])


def _gather(e: SymbolicShapes, node: ir.Node, out, ins) -> None:
    axis = node.attributes.get_int("axis", 0) % len(ins[0])
    e._set(out, [*ins[0][:axis], *ins[1], *ins[0][axis + 1 :]])


def _expand(e: SymbolicShapes, node: ir.Node, out, ins) -> None:
    target = e.shape_value(node.inputs[1])
    if target is not None:
        e._set(out, e._broadcast([ins[0], target]))


def _tile(e: SymbolicShapes, node: ir.Node, out, ins) -> None:
    repeats = e._ints(node.inputs[1])
    if repeats is not None and len(repeats) == len(ins[0]):
        e._set(out, [_simplify(_expr(d) * r) for d, r in zip(ins[0], repeats)])


def _flatten(e: SymbolicShapes, node: ir.Node, out, ins) -> None:
    axis = node.attributes.get_int("axis", 1) % (len(ins[0]) + 1)
    e._set(out, [_simplify(sympy.Mul(*map(_expr, ins[0][:axis]))), _simplify(sympy.Mul(*map(_expr, ins[0][axis:])))])


def _arg_extreme(e: SymbolicShapes, node: ir.Node, out, ins) -> None:
    axis = node.attributes.get_int("axis", 0) % len(ins[0])
    keep = node.attributes.get_int("keepdims", 1)
    e._set(out, list(ins[0][:axis]) + ([1] if keep else []) + list(ins[0][axis + 1 :]))


def _shape(e: SymbolicShapes, node: ir.Node, out, ins) -> object:
    rank = len(ins[0])
    kept = ins[0][slice(node.attributes.get_int("start", 0), node.attributes.get_int("end", rank))]
    e._set(out, [len(kept)])
    e._values[out] = tuple(kept)
    return _VALUES_SET


def _size(e: SymbolicShapes, node: ir.Node, out, ins) -> object:
    e._set(out, [])
    e._values[out] = _simplify(sympy.Mul(*[_expr(d) for d in ins[0]]))
    return _VALUES_SET


_SHAPE_RULES: dict[str, tuple[int, Callable[..., object]]] = {
    **{op: (1, lambda e, node, out, ins: e._set(out, ins[0])) for op in SAME_SHAPE},
    **{
        op: (0, lambda e, node, out, ins: e._set(out, e._broadcast(ins) if None not in ins else None))
        for op in BROADCAST
    },
    **{
        op: (1, lambda e, node, out, ins: e._windowed(node, out, ins[0], ins[1] if len(ins) > 1 else None))
        for op in WINDOWED
    },
    **{op: (1, lambda e, node, out, ins: e._set(out, [*ins[0][:2], *[1] * (len(ins[0]) - 2)])) for op in GLOBAL_POOL},
    **{
        op: (2, lambda e, node, out, ins: e._matmul(node, out, ins[0], ins[1]))
        for op in ("MatMul", "FusedMatMul", "MatMulInteger")
    },
    **{op: (1, lambda e, node, out, ins: e._resize(node, out, ins[0])) for op in ("Resize", "Upsample")},
    **{op: (1, lambda e, node, out, ins: e._squeeze(node, out, ins[0])) for op in ("Unsqueeze", "Squeeze")},
    **{
        op: (1, lambda e, node, out, ins: e._reduce(node, out, ins[0]))
        for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1")
    },
    **{op: (1, _arg_extreme) for op in ("ArgMax", "ArgMin")},
    "Gemm": (2, _gemm),
    "Transpose": (1, _transpose),
    "ConvTranspose": (
        1,
        lambda e, node, out, ins: e._conv_transpose(node, out, ins[0], ins[1] if len(ins) > 1 else None),
    ),
    "Pad": (1, lambda e, node, out, ins: e._pad(node, out, ins[0])),
    "Reshape": (0, lambda e, node, out, ins: e._reshape(node, out, ins[0])),
    "Split": (1, lambda e, node, out, ins: e._split(node, ins[0])),
    "Concat": (0, lambda e, node, out, ins: e._concat(node, out, ins)),
    "Gather": (2, _gather),
    "Slice": (1, lambda e, node, out, ins: e._slice(node, out, ins[0])),
    "Expand": (1, _expand),
    "ConstantOfShape": (0, lambda e, node, out, ins: e._constant_of_shape(node, out)),
    "Range": (0, lambda e, node, out, ins: e._range(out, *(e.scalar_value(v) for v in node.inputs[:3]))),
    "Tile": (1, _tile),
    "Flatten": (1, _flatten),
    "Shape": (1, _shape),
    "Size": (1, _size),
}


# --- shape values through the ops exporters compute shapes with: each rule gives the output's value or None ---


def _value_copy(e: SymbolicShapes, node: ir.Node, first) -> object:
    if node.op_type == "Identity" or node.attributes.get_int("to", 0) in (ir.DataType.INT64, ir.DataType.INT32):
        return first
    return None


def _value_gather(e: SymbolicShapes, node: ir.Node, first) -> object:
    if not isinstance(first, tuple) or node.attributes.get_int("axis", 0) != 0:
        return None
    index = e._values.get(node.inputs[1])
    if isinstance(index, tuple):
        return tuple(first[_index(i, len(first))] for i in index)
    if index is not None and is_int(index):
        return first[_index(index, len(first))]
    return None


def _value_unsqueeze(e: SymbolicShapes, node: ir.Node, first) -> object:
    return (first,) if first is not None and not isinstance(first, tuple) else None


def _value_squeeze(e: SymbolicShapes, node: ir.Node, first) -> object:
    return first[0] if isinstance(first, tuple) and len(first) == 1 else None


def _value_reshape(e: SymbolicShapes, node: ir.Node, first) -> object:
    if first is None:
        return None
    elements = first if isinstance(first, tuple) else (first,)
    target = e._ints(node.inputs[1])
    if target is not None and len(target) == 1 and target[0] in (-1, len(elements)):
        return tuple(elements)
    if target == [] and len(elements) == 1:
        return elements[0]
    return None


def _value_concat(e: SymbolicShapes, node: ir.Node, first) -> object:
    if node.attributes.get_int("axis", 0) not in (0, -1):
        return None
    pieces = [e._values.get(v) for v in node.inputs]
    if all(isinstance(p, tuple) for p in pieces):
        return tuple(d for p in pieces for d in p)
    return None


def _value_slice(e: SymbolicShapes, node: ir.Node, first) -> object:
    if not isinstance(first, tuple) or len(node.inputs) < 3:
        return None
    starts, ends = e._ints(node.inputs[1]), e._ints(node.inputs[2])
    axes = e._ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
    steps = e._ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if starts and ends and len(starts) == 1 and axes in ([0], [-1]) and steps and steps[0] != 0:
        return first[slice(starts[0], ends[0], steps[0])]
    return None


def _value_elementwise(e: SymbolicShapes, node: ir.Node, first) -> object:
    return e._elementwise(node.op_type, first, e._values.get(node.inputs[1])) if len(node.inputs) == 2 else None


def _value_where(e: SymbolicShapes, node: ir.Node, first) -> object:
    if len(node.inputs) != 3:
        return None
    return e._where(first, e._values.get(node.inputs[1]), e._values.get(node.inputs[2]))


_VALUE_RULES: dict[str, Callable[[SymbolicShapes, ir.Node, object], object]] = {
    "Identity": _value_copy,
    "Cast": _value_copy,
    "Gather": _value_gather,
    "Unsqueeze": _value_unsqueeze,
    "Squeeze": _value_squeeze,
    "Reshape": _value_reshape,
    "Concat": _value_concat,
    "Slice": _value_slice,
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Equal"), _value_elementwise),
    "Where": _value_where,
}
