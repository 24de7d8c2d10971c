"""Random small ONNX graphs for the property tests (hypothesis strategies), one family per pass.

Every strategy draws a *valid* model (``onnx.checker`` with the full check: strict shape
inference must agree with the shapes declared here) together with seeded input sets,
as a :class:`Case`. Hypothesis draws a seed; the graph comes from it (see :func:`seeded`:
a failing case is reported as ``from_seed(N)`` and printed as ONNX text).

The graphs are built from a pool of values with known dtype and static shape: each
step draws an op that fits some value of the pool (elementwise ops with broadcasting,
MatMul/Gemm, Reshape/Transpose, Concat/Split, Gather with int64 indices, Cast chains,
reductions, LayerNormalization, Softmax, If with subgraphs, ...) and adds what it makes.
Constants come as initializers or Constant nodes, of several dtypes and sizes, and are
sometimes shared by several readers. Float values carry a rough bound of their size
(``scale``) so that the fp16 family stays in the range where fp16 rounding is the only
difference a conversion may make (no cancellation of huge terms), except for the
*massive* activations it plants on purpose (over fp16's 65,504, as DINOv3's residual
channel), which only ops that tame them read.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

F32, F16, F64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE
I64, I32, BOOL = TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
FLOATS = (F32, F16, F64)
NUMPY = {F32: np.float32, F16: np.float16, F64: np.float64, I64: np.int64, I32: np.int32, BOOL: np.bool_}
OPSET = 18

#: How every property runs: 200 graphs, the same on every run (CI is deterministic). To hunt for
#: bugs, ONNXSMITH_EXPLORE=N runs N fresh random graphs instead.
PROPERTY = settings(
    max_examples=int(os.environ.get("ONNXSMITH_EXPLORE") or 200),
    derandomize=not os.environ.get("ONNXSMITH_EXPLORE"),
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class Value:
    name: str
    dtype: int
    shape: tuple[int, ...]
    #: A rough bound on |x| (float values): what an fp16 conversion's rounding is relative to.
    scale: float = 1.0
    #: Over fp16's range on purpose (a planted massive activation).
    massive: bool = False
    #: Its value, when it is a constant.
    const: np.ndarray | None = None
    #: Made in a subgraph: readable only there.
    local: bool = False
    #: Read by a node (a value nothing reads is a leaf: a graph output, or dead code).
    read: bool = False
    #: Computed from a Shape or Size: onnxruntime propagates such values at load time, and
    #: its propagation trips over some of them (Unsqueeze, then a broadcasting op), at random.
    from_shape: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class Case:
    """A drawn model and the input sets to run it on."""

    model: onnx.ModelProto
    feeds: list[dict[str, np.ndarray]]
    options: dict = field(default_factory=dict)  # what the test should pass to the pass/transform

    def __repr__(self) -> str:
        return f"Case(options={self.options!r}, model=\n{onnx.printer.to_text(self.model)}\n)"


class GraphBuilder:
    """A graph under construction: its nodes, constants, inputs and the pool of values to read."""

    def __init__(self, random: np.random.Generator, *, parent: GraphBuilder | None = None) -> None:
        self.random = random
        self.parent = parent
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[Value] = []
        self.pool: list[Value] = []
        self.constants: list[Value] = []
        self._counter = [0] if parent is None else parent._counter

    # -- naming and drawing ------------------------------------------------------------

    def fresh(self, base: str) -> str:
        self._counter[0] += 1
        return f"{base}{self._counter[0]}"

    def pick(self, items):
        items = list(items)
        return items[int(self.random.integers(len(items)))]

    def coin(self, p: float = 0.5) -> bool:
        return bool(self.random.random() < p)

    def integer(self, lo: int, hi: int) -> int:
        return int(self.random.integers(lo, hi + 1))

    # -- making values -----------------------------------------------------------------

    def add_input(self, dtype: int, shape: tuple[int, ...], scale: float = 1.0) -> Value:
        value = Value(self.fresh("in"), dtype, tuple(shape), scale=scale)
        self.inputs.append(value)
        self.pool.append(value)
        return value

    def add_const(
        self, array: np.ndarray, *, node: bool | None = None, share: bool = True, pooled: bool = True
    ) -> Value:
        """A constant (initializer or Constant node); an equal one already made is reused at times."""
        array = np.asarray(array)
        if share:
            for c in self.constants:
                same = c.const.dtype == array.dtype and c.const.shape == array.shape
                if same and c.const.tobytes() == array.tobytes() and self.coin(0.7):
                    return c
        dtype = helper.np_dtype_to_tensor_dtype(array.dtype)
        scale = float(np.max(np.abs(array))) if array.dtype.kind == "f" and array.size else 1.0
        value = Value(
            self.fresh("c"), dtype, array.shape, scale=max(scale, 1e-3), const=array, local=self.parent is not None
        )
        tensor = numpy_helper.from_array(array, value.name)
        in_node = self.coin(0.35) if node is None else node
        if in_node or (self.parent is not None and node is None):
            self.nodes.append(helper.make_node("Constant", [], [value.name], value=tensor))
        else:
            self.initializers.append(tensor)
        self.constants.append(value)
        if pooled:
            self.pool.append(value)
        return value

    def ints(self, values, dtype=np.int64) -> Value:
        """A small int64 constant (a shape, axes, indices), shared with an equal one at times."""
        return self.add_const(np.asarray(values, dtype=dtype), pooled=False)

    def op(
        self,
        op_type: str,
        inputs: list[Value | None],
        outputs: list[tuple[int, tuple[int, ...]]],
        *,
        scale: float | list[float] = 1.0,
        massive: bool = False,
        domain: str = "",
        pooled: bool = True,
        **attributes,
    ) -> list[Value]:
        scales = scale if isinstance(scale, list) else [scale] * len(outputs)
        from_shape = op_type in ("Shape", "Size") or any(v.from_shape for v in inputs if v is not None)
        made = [
            Value(
                self.fresh(op_type.lower()),
                dtype,
                tuple(shape),
                scale=s,
                massive=massive,
                local=self.parent is not None,
                from_shape=from_shape,
            )
            for (dtype, shape), s in zip(outputs, scales)
        ]
        self.nodes.append(
            helper.make_node(
                op_type,
                ["" if v is None else v.name for v in inputs],
                [v.name for v in made],
                name=self.fresh(f"n_{op_type}_"),
                domain=domain,
                **attributes,
            )
        )
        for v in inputs:
            if v is not None:
                v.read = True
        if pooled:
            self.pool.extend(made)
        return made

    def one(self, op_type: str, inputs: list[Value | None], dtype: int, shape, **kwargs) -> Value:
        return self.op(op_type, inputs, [(dtype, tuple(shape))], **kwargs)[0]

    # -- the result --------------------------------------------------------------------

    def graph(self, outputs: list[Value], name: str = "random") -> onnx.GraphProto:
        return helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(v.name, v.dtype, v.shape) for v in self.inputs],
            [helper.make_tensor_value_info(v.name, v.dtype, v.shape) for v in outputs],
            self.initializers,
        )

    def model(self, outputs: list[Value]) -> onnx.ModelProto:
        model = helper.make_model(self.graph(outputs), opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
        try:
            onnx.checker.check_model(model, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:  # a generator bug
            raise AssertionError(
                f"the generator made an invalid model ({err}):\n{onnx.printer.to_text(model)}"
            ) from None
        return model

    def feeds(self, sets: int = 2) -> list[dict[str, np.ndarray]]:
        rng = self.random
        found = []
        for _ in range(sets):
            feeds = {}
            for v in self.inputs:
                if v.dtype in FLOATS:
                    feeds[v.name] = (rng.standard_normal(v.shape) * min(v.scale, 1.0)).astype(NUMPY[v.dtype])
                elif v.dtype == BOOL:
                    feeds[v.name] = rng.random(v.shape) < 0.5
                else:
                    feeds[v.name] = rng.integers(-4, 8, v.shape).astype(NUMPY[v.dtype])
            found.append(feeds)
        return found

    # -- choosing what to read -----------------------------------------------------------

    def readable(self, dtypes=(F32,), *, massive: bool | None = False, computed: bool = False) -> list[Value]:
        found = [
            v
            for v in self.pool
            if v.dtype in dtypes
            and (massive is None or v.massive == massive)
            and not (computed and v.const is not None)
        ]
        return found

    def choose(self, dtypes=(F32,), **kwargs) -> Value | None:
        found = self.readable(dtypes, **kwargs)
        if not found:
            return None
        # Mostly the newest values: graphs get deep rather than wide.
        recent = found[-4:]
        return self.pick(recent if self.coin(0.75) else found)

    def outputs(self, dtypes=(F32,), *, at_most: int = 3, massive: bool | None = None) -> list[Value]:
        """The graph's outputs: the newest leaves (values nothing reads), so little is dead code."""
        computed = [v for v in self.readable(dtypes, massive=massive, computed=True) if not v.local]
        computed = computed or [v for v in self.readable(dtypes, massive=massive) if not v.local]
        leaves = [v for v in computed if not v.read] or computed[-1:]
        return leaves[::-1][: self.integer(1, at_most)]


# ---- shapes ---------------------------------------------------------------------------------


def small_shape(b: GraphBuilder, rank_lo: int = 1, rank_hi: int = 3) -> tuple[int, ...]:
    return tuple(b.integer(1, 5) for _ in range(b.integer(rank_lo, rank_hi)))


def broadcast_partner(b: GraphBuilder, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape``: some trailing dims of it, each possibly 1."""
    keep = b.integer(0, len(shape))
    return tuple(d if b.coin(0.7) else 1 for d in shape[len(shape) - keep :])


def normal(b: GraphBuilder, shape, scale: float = 1.0, dtype=np.float32) -> np.ndarray:
    return (b.random.standard_normal(shape) * scale).astype(dtype)


def reshape_target(b: GraphBuilder, shape: tuple[int, ...]) -> tuple[list[int], tuple[int, ...]]:
    """(the Reshape shape input, with -1 or 0 at times; the resulting shape)."""
    size = math.prod(shape)
    kind = b.pick(["flatten", "merge", "split", "unsqueeze", "same"])
    if kind == "flatten" or not shape:
        out = (size,)
    elif kind == "merge" and len(shape) >= 2:
        out = shape[:-2] + (shape[-2] * shape[-1],)
    elif kind == "split":
        axis = b.integer(0, len(shape) - 1)
        d = shape[axis]
        factors = [f for f in range(2, d) if d % f == 0] or [1]
        f = b.pick(factors)
        out = shape[:axis] + (f, d // f) + shape[axis + 1 :]
    elif kind == "unsqueeze":
        axis = b.integer(0, len(shape))
        out = shape[:axis] + (1,) + shape[axis:]
    else:
        out = shape
    target = list(out)
    if target and b.coin(0.3):
        target[b.integer(0, len(target) - 1)] = -1
    elif b.coin(0.2):  # 0 copies the input's dim at that position
        same = [i for i in range(min(len(shape), len(target))) if shape[i] == target[i]]
        if same:
            target[b.pick(same)] = 0
    return target, out


# ---- float ops ------------------------------------------------------------------------------

#: Unary ops and the bound on |y| given the bound s on |x|.
UNARY = {
    "Relu": lambda s: s,
    "Neg": lambda s: s,
    "Abs": lambda s: s,
    "Identity": lambda s: s,
    "Tanh": lambda s: 1.0,
    "Sigmoid": lambda s: 1.0,
    "Erf": lambda s: 1.0,
    "Softsign": lambda s: 1.0,
    "Elu": lambda s: s,
    "LeakyRelu": lambda s: s,
    "Softplus": lambda s: s + 1.0,
    "Sin": lambda s: 1.0,
    "Exp": math.exp,  # only on values up to 2 (see FloatOps.unary)
}


class FloatOps:
    """Ops on float32 values (fp16-safe by default: nothing that amplifies rounding)."""

    def __init__(self, b: GraphBuilder, *, max_scale: float = 8.0, massive: bool = False, casts=True) -> None:
        self.b = b
        self.max_scale = max_scale
        self.massive = massive
        self.casts = casts

    def partner(self, shape: tuple[int, ...], scale: float = 1.0) -> Value:
        """Something to combine with a value of ``shape``: a constant, a broadcastable value, itself."""
        b = self.b
        same = [v for v in b.readable((F32,)) if _broadcasts_to(v.shape, shape) and v.scale <= self.max_scale]
        if same and b.coin(0.4):
            return b.pick(same[-6:])
        return b.add_const(normal(b, broadcast_partner(b, shape), scale))

    def step(self) -> None:
        b = self.b
        x = b.choose((F32,), massive=None if self.massive else False)
        if x is None:
            return
        if x.massive:
            self.tame(x)
            return
        makers = [
            self.unary,
            self.unary,
            self.binary,
            self.binary,
            self.divide,
            self.matmul,
            self.gemm,
            self.reshape,
            self.transpose,
            self.concat,
            self.split,
            self.gather,
            self.slice,
            self.reduce,
            self.softmax,
            self.layer_norm,
            self.unsqueeze,
            self.expand,
        ]
        if self.casts:
            makers.append(self.cast_chain)
        if self.massive:
            makers += [self.plant_massive, self.plant_massive, self.residual_stream]
        b.pick(makers)(x)

    # one op each; the result joins the pool

    def unary(self, x: Value) -> None:
        op = self.b.pick(UNARY)
        if op == "Exp" and x.scale > 2:
            return
        attrs = {"alpha": 0.1} if op == "LeakyRelu" else {}
        self.b.one(op, [x], F32, x.shape, scale=UNARY[op](x.scale), massive=x.massive, **attrs)

    def binary(self, x: Value) -> None:
        b = self.b
        op = b.pick(["Add", "Sub", "Mul", "Max", "Min"])
        y = x if b.coin(0.1) else self.partner(x.shape)
        grow = x.scale * y.scale if op == "Mul" else x.scale + y.scale
        if grow > self.max_scale:
            return
        first, second = (x, y) if b.coin(0.7) else (y, x)
        b.one(op, [first, second], F32, np.broadcast_shapes(x.shape, y.shape), scale=grow)

    def divide(self, x: Value) -> None:
        """x / (|y| + 1): a divisor that stays away from zero."""
        b = self.b
        y = self.partner(x.shape)
        absolute = b.one("Abs", [y], F32, y.shape, scale=y.scale)
        one = b.add_const(np.ones((), np.float32) if b.coin() else np.ones((1,), np.float32))
        shifted = b.one("Add", [absolute, one], F32, np.broadcast_shapes(y.shape, one.shape), scale=y.scale + 1)
        b.one("Div", [x, shifted], F32, np.broadcast_shapes(x.shape, shifted.shape), scale=x.scale)

    def matmul(self, x: Value) -> None:
        b = self.b
        if not x.shape:
            return
        k = x.shape[-1]
        if x.rank >= 2 and b.coin(0.25):  # x @ x^T: an activation times an activation
            if x.scale * x.scale * k > self.max_scale:
                return
            perm = list(range(x.rank))
            perm[-1], perm[-2] = perm[-2], perm[-1]
            xt = b.one("Transpose", [x], F32, tuple(x.shape[p] for p in perm), scale=x.scale, perm=perm)
            b.one("MatMul", [x, xt], F32, x.shape[:-1] + (x.shape[-2],), scale=x.scale * x.scale * k)
            return
        n = b.integer(1, 6)
        w = b.add_const(normal(b, (k, n), 1 / math.sqrt(k)))
        shape = x.shape[:-1] + (n,)
        b.one("MatMul", [x, w], F32, shape, scale=min(x.scale * 2.5, self.max_scale))

    def gemm(self, x: Value) -> None:
        b = self.b
        if x.rank != 2:
            return
        m, k = x.shape
        n = b.integer(1, 5)
        trans_b = b.integer(0, 1)
        w = b.add_const(normal(b, (n, k) if trans_b else (k, n), 1 / math.sqrt(k)))
        bias_shape = b.pick([(n,), (1, n), (m, n), ()])
        inputs = [x, w, b.add_const(normal(b, bias_shape, 0.5))] if b.coin(0.8) else [x, w]
        alpha = b.pick([1.0, 0.5])
        b.one("Gemm", inputs, F32, (m, n), scale=min(x.scale * 2.5 + 1, self.max_scale), transB=trans_b, alpha=alpha)

    def reshape(self, x: Value) -> None:
        target, out = reshape_target(self.b, x.shape)
        self.b.one("Reshape", [x, self.b.ints(target)], F32, out, scale=x.scale, massive=x.massive)

    def transpose(self, x: Value) -> None:
        if x.rank < 2:
            return
        perm = [int(p) for p in self.b.random.permutation(x.rank)]
        self.b.one("Transpose", [x], F32, tuple(x.shape[p] for p in perm), scale=x.scale, massive=x.massive, perm=perm)

    def unsqueeze(self, x: Value) -> None:
        b = self.b
        if x.rank >= 4:
            return
        axis = b.integer(-x.rank - 1, x.rank)
        at = axis if axis >= 0 else axis + x.rank + 1
        b.one(
            "Unsqueeze", [x, b.ints([axis])], F32, x.shape[:at] + (1,) + x.shape[at:], scale=x.scale, massive=x.massive
        )

    def expand(self, x: Value) -> None:
        b = self.b
        if x.rank >= 4 or x.size > 64:
            return
        lead = b.integer(1, 3)
        shape = (lead,) + tuple(d if d != 1 or not b.coin() else b.integer(1, 3) for d in x.shape)
        b.one("Expand", [x, b.ints(list(shape))], F32, shape, scale=x.scale, massive=x.massive)

    def concat(self, x: Value) -> None:
        b = self.b
        if not x.shape:
            return
        axis = b.integer(-x.rank, x.rank - 1)
        a = axis % x.rank
        others = [
            v
            for v in b.readable((F32,), massive=None)
            if v.rank == x.rank and all(v.shape[i] == x.shape[i] for i in range(x.rank) if i != a)
        ]
        other = b.pick(others[-5:]) if others and b.coin(0.5) else None
        if other is None:
            shape = list(x.shape)
            shape[a] = b.integer(1, 3)
            other = b.add_const(normal(b, tuple(shape)))
        if other.massive and not self.massive:
            return
        shape = list(x.shape)
        shape[a] = x.shape[a] + other.shape[a]
        b.one(
            "Concat",
            [x, other],
            F32,
            shape,
            scale=max(x.scale, other.scale),
            massive=x.massive or other.massive,
            axis=axis,
        )

    def split(self, x: Value) -> None:
        b = self.b
        axes = [i for i, d in enumerate(x.shape) if d >= 2]
        if not axes:
            return
        a = b.pick(axes)
        first = b.integer(1, x.shape[a] - 1)
        shapes = []
        for part in (first, x.shape[a] - first):
            shape = list(x.shape)
            shape[a] = part
            shapes.append((F32, tuple(shape)))
        b.op("Split", [x, b.ints([first, x.shape[a] - first])], shapes, scale=x.scale, massive=x.massive, axis=a)

    def gather(self, x: Value) -> None:
        b = self.b
        if not x.shape:
            return
        axis = b.integer(-x.rank, x.rank - 1)
        a = axis % x.rank
        d = x.shape[a]
        index_shape = b.pick([(), (b.integer(1, 4),), (2, b.integer(1, 3))])
        indices = b.random.integers(-d, d, index_shape).astype(np.int64)
        out = x.shape[:a] + index_shape + x.shape[a + 1 :]
        b.one("Gather", [x, b.ints(indices)], F32, out, scale=x.scale, massive=x.massive, axis=axis)

    def slice(self, x: Value) -> None:
        b = self.b
        if not x.shape:
            return
        a = b.integer(0, x.rank - 1)
        d = x.shape[a]
        step = b.pick([1, 1, 2, -1])
        if step > 0:
            start = b.integer(0, d - 1)
            stop = b.integer(start + 1, d)
            length = len(range(start, stop, step))
            starts, ends = [start - d if b.coin(0.3) else start], [stop if stop < d or b.coin() else 2**31]
        else:
            start = b.integer(0, d - 1)
            length = start + 1
            starts, ends = [start], [-(2**31)]
        shape = list(x.shape)
        shape[a] = length
        axis = a - x.rank if b.coin(0.3) else a
        inputs = [x, b.ints(starts), b.ints(ends), b.ints([axis]), b.ints([step])]
        b.one("Slice", inputs, F32, shape, scale=x.scale, massive=x.massive)

    def reduce(self, x: Value) -> None:
        b = self.b
        if not x.shape:
            return
        op = b.pick(["ReduceMean", "ReduceSum", "ReduceMax"])
        axes = sorted({b.integer(0, x.rank - 1) for _ in range(b.integer(1, x.rank))})
        keep = b.integer(0, 1)
        shape = tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keep or i not in axes)
        count = math.prod(x.shape[i] for i in axes)
        scale = x.scale * count if op == "ReduceSum" else x.scale
        if scale > self.max_scale:
            return
        b.one(op, [x, b.ints(axes)], F32, shape, scale=scale, keepdims=keep)

    def softmax(self, x: Value) -> None:
        if not x.shape or x.scale > 4:
            return
        axis = self.b.integer(-x.rank, x.rank - 1)
        self.b.one(
            self.b.pick(["Softmax", "Softmax", "LogSoftmax"]), [x], F32, x.shape, scale=1.0 + 2 * x.scale * 2, axis=axis
        )

    def layer_norm(self, x: Value, *, pooled: bool = True) -> Value | None:
        b = self.b
        if not x.shape:
            return None
        d = x.shape[-1]
        scale = b.add_const((1 + normal(b, (d,), 0.2)).astype(np.float32), pooled=pooled)
        bias = b.add_const(normal(b, (d,), 0.2), pooled=pooled)
        return b.one(
            "LayerNormalization",
            [x, scale, bias],
            F32,
            x.shape,
            scale=1.5 * math.sqrt(d) + 0.5,
            axis=-1,
            epsilon=1e-5,
            pooled=pooled,
        )

    def cast_chain(self, x: Value) -> None:
        """A round trip through another type, as exporters write them (and a double computation)."""
        b = self.b
        kind = b.pick(["fp16", "double"])
        if kind == "fp16":
            half = b.one("Cast", [x], F16, x.shape, scale=x.scale, to=F16)
            b.one("Cast", [half], F32, x.shape, scale=x.scale, to=F32)
        else:
            wide = b.one("Cast", [x], F64, x.shape, scale=x.scale, to=F64, pooled=False)
            c = b.add_const(normal(b, broadcast_partner(b, x.shape), 1.0, np.float64), pooled=False)
            if c.scale * x.scale > self.max_scale:
                return
            product = b.one(
                "Mul", [wide, c], F64, np.broadcast_shapes(x.shape, c.shape), scale=x.scale * c.scale, pooled=False
            )
            b.one("Cast", [product], F32, product.shape, scale=product.scale, to=F32)

    # massive activations: made on purpose, read only by what tames them

    def plant_massive(self, x: Value) -> None:
        b = self.b
        if not x.shape or x.scale > 4:
            return
        d = x.shape[-1]
        big = np.zeros(d, np.float32) if b.coin() else np.ones(d, np.float32)
        big[b.integer(0, d - 1)] = b.pick([3.0e4, 1.0e5, 1.6e5])
        c = b.add_const(big)
        op = b.pick(["Add", "Mul"]) if big.min() > 0 else "Add"
        scale = (float(big.max()) * (x.scale if op == "Mul" else 1.0)) + x.scale
        b.one(op, [x, c], F32, x.shape, scale=scale, massive=True)

    def tame(self, x: Value) -> None:
        b = self.b
        kind = b.pick(["layer_norm", "shrink", "relu", "add", "reshape", "transpose", "gather"])
        if kind == "layer_norm":
            self.layer_norm(x)
        elif kind == "shrink":
            c = b.add_const(np.full(broadcast_partner(b, x.shape), 1.0 / x.scale, np.float32))
            b.one("Mul", [x, c], F32, np.broadcast_shapes(x.shape, c.shape), scale=1.5)
        elif kind == "relu":
            b.one("Relu", [x], F32, x.shape, scale=x.scale, massive=True)
        elif kind == "add":
            y = self.partner(x.shape)
            b.one("Add", [x, y], F32, np.broadcast_shapes(x.shape, y.shape), scale=x.scale + y.scale, massive=True)
        else:
            getattr(self, kind)(x)

    def residual_stream(self, x: Value) -> None:
        """A pre-LN transformer's residual stream: s = embed(x); s += branch(LN(s)) twice or more;
        LN(s). At times with a massive channel, written by the embedding or by a branch (DINOv3)."""
        b = self.b
        if x.rank < 2 or x.scale > 4:
            return
        pooled = b.coin(0.25)  # read by more than norms: the stream cannot be rescaled
        d, width = x.shape[-1], b.integer(2, 6)
        shape = x.shape[:-1] + (width,)
        s = b.one(
            "MatMul",
            [x, b.add_const(normal(b, (d, width), 1 / math.sqrt(d)))],
            F32,
            shape,
            scale=2.5 * x.scale,
            pooled=pooled,
        )
        massive = False

        def offset() -> Value:
            big = np.zeros(width, np.float32)
            big[b.integer(0, width - 1)] = b.pick([1.0e5, 1.56e5])
            return b.add_const(big, pooled=False)

        if b.coin(0.5):
            s = b.one("Add", [s, offset()], F32, shape, scale=2e5, massive=True, pooled=pooled)
            massive = True
        for _ in range(b.integer(2, 3)):
            h = self.layer_norm(s, pooled=False)
            hidden = b.integer(2, 6)
            up = b.one(
                "MatMul",
                [h, b.add_const(normal(b, (width, hidden), 1 / math.sqrt(width)))],
                F32,
                shape[:-1] + (hidden,),
                pooled=False,
            )
            act = b.one(b.pick(["Relu", "Tanh", "Erf"]), [up], F32, up.shape, pooled=False)
            branch = b.one(
                "MatMul",
                [act, b.add_const(normal(b, (hidden, width), 1 / math.sqrt(hidden)))],
                F32,
                shape,
                pooled=False,
            )
            if b.coin(0.5):  # layer scale
                branch = b.one(
                    "Mul",
                    [branch, b.add_const(np.full(width, 0.5, np.float32), pooled=False)],
                    F32,
                    shape,
                    pooled=False,
                )
            if self.massive and not massive and b.coin(0.3):
                branch = b.one("Add", [branch, offset()], F32, shape, scale=2e5, massive=True, pooled=False)
                massive = True
            s = b.one(
                "Add", [s, branch], F32, shape, scale=2e5 if massive else s.scale + 3, massive=massive, pooled=pooled
            )
        self.layer_norm(s)

    # control flow

    def if_node(self) -> None:
        """If(ReduceSum(an input) > 0): two branches computing a value of the same shape from outer values."""
        b = self.b
        outer = [v for v in b.readable((F32,)) if not v.local and v.scale <= 4]
        source = next((v for v in b.inputs if v.dtype == F32), None)
        if not outer or source is None:
            return
        x = b.pick(outer[-4:])
        total = b.one("ReduceSum", [source], F32, (), keepdims=0, pooled=False)
        zero = b.add_const(np.zeros((), np.float32), pooled=False)
        cond = b.one("Greater", [total, zero], BOOL, (), pooled=False)
        branches = []
        for _ in range(2):
            sub = GraphBuilder(b.random, parent=b)
            sub.pool = [v for v in b.pool if not v.local]
            ops = FloatOps(sub, max_scale=self.max_scale, massive=False, casts=self.casts)
            y = x
            for _ in range(b.integer(1, 2)):
                y = ops.elementwise_keeping_shape(y)
            branches.append((sub.graph([y], name=b.fresh("branch")), y.scale))
        scale = max(s for _, s in branches)
        b.op("If", [cond], [(F32, x.shape)], scale=scale, then_branch=branches[0][0], else_branch=branches[1][0])

    def elementwise_keeping_shape(self, x: Value) -> Value:
        b = self.b
        kind = b.pick(["unary", "add", "mul", "const"])
        if kind == "unary":
            op = b.pick(["Relu", "Tanh", "Neg", "Sigmoid"])
            return b.one(op, [x], F32, x.shape, scale=UNARY[op](x.scale))
        if kind == "const":
            c = b.add_const(normal(b, x.shape, 0.5))  # a Constant node inside the branch
            return b.one("Add", [x, c], F32, x.shape, scale=x.scale + 0.5)
        c = b.add_const(normal(b, broadcast_partner(b, x.shape), 0.5))
        op = "Add" if kind == "add" else "Mul"
        return b.one(op, [x, c], F32, x.shape, scale=x.scale * 1.5 + 0.5)


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


# ---- the families ---------------------------------------------------------------------------


def seeded(build):
    """A strategy of cases from ``build(builder, **kwargs)``: hypothesis draws the seed, the builder
    draws everything else from it (hypothesis's own draws crowd at their simplest values, and a
    graph is too entangled for its shrinking to simplify). ``strategy.from_seed(N)`` rebuilds the
    case hypothesis reports as ``from_seed(N)``."""

    def from_seed(seed: int, **kwargs) -> Case:
        return build(GraphBuilder(np.random.default_rng(seed)), **kwargs)

    def strategy(**kwargs):
        return st.integers(0, 2**32 - 1).map(lambda seed: from_seed(seed, **kwargs))

    strategy.__name__ = build.__name__
    strategy.__doc__ = build.__doc__
    strategy.from_seed = from_seed
    return strategy


@seeded
def float_graphs(b: GraphBuilder, *, massive: bool = False, control_flow: bool = True, steps=(2, 10)) -> Case:
    """Float32 graphs: elementwise ops with broadcasting, MatMul/Gemm, data movement, reductions,
    normalisations, Cast chains, If; ``massive``: also activations over fp16's range."""
    for _ in range(b.integer(1, 2)):
        b.add_input(F32, small_shape(b, 1, 3))
    ops = FloatOps(b, massive=massive)
    for _ in range(b.integer(*steps)):
        if control_flow and b.coin(0.05):
            ops.if_node()
        else:
            ops.step()
    return Case(b.model(b.outputs((F32,))), b.feeds())


# ---- integer (index) ops --------------------------------------------------------------------

#: Keep int64 values below this: products stay exact in int64 (and beyond int32 when wanted).
INT_LIMIT = 2**50


class IntOps:
    """Ops on int64 values: index arithmetic as exporters write it (shapes, positions, grids),
    sometimes with values beyond int32 on purpose, read where int32 would do (Gather indices, Cast)."""

    def __init__(self, b: GraphBuilder, *, big: float = 0.2) -> None:
        self.b = b
        self.big = big  # how often a constant holds values beyond int32

    # sources

    def source(self) -> Value | None:
        b = self.b
        kind = b.pick(["const", "const", "shape", "size", "constant_of_shape", "range", "argmax", "cast", "input"])
        floats = [v for v in b.pool if v.dtype == F32 and v.shape]
        if kind == "const":
            shape = b.pick([(), (b.integer(1, 4),), (b.integer(1, 3), b.integer(1, 4))])
            c = self.constant(shape)
            b.pool.append(c)
            return c
        if kind == "shape" and b.pool:
            v = b.pick(b.pool)
            start = b.integer(-v.rank, v.rank) if b.coin(0.2) and v.rank else None
            dims = list(v.shape)[slice(start, None)]
            if not dims:
                return None  # no empty tensors: a 0 in a Reshape target would mean "copy"
            attrs = {"start": start} if start is not None else {}
            return b.one("Shape", [v], I64, (len(dims),), scale=max(dims + [1]), **attrs)
        if kind == "size" and b.pool:
            v = b.pick(b.pool)
            return b.one("Size", [v], I64, (), scale=max(v.size, 1))
        if kind == "constant_of_shape":
            shape = [b.integer(1, 4) for _ in range(b.integer(1, 2))]
            fill = b.pick([0, 1, 7, 2**32 + 1])
            value = numpy_helper.from_array(np.array([fill], np.int64))
            return b.one("ConstantOfShape", [b.ints(shape)], I64, tuple(shape), scale=max(fill, 1), value=value)
        if kind == "range":
            start, delta = b.integer(-3, 5), b.pick([1, 2, 3, -1])
            length = b.integer(1, 6)
            limit = start + delta * length
            inputs = [b.add_const(np.array(x, np.int64), pooled=False) for x in (start, limit, delta)]
            return b.one("Range", inputs, I64, (length,), scale=max(abs(start), abs(limit), 1))
        if kind == "argmax" and floats:
            x = b.pick(floats)
            axis = b.integer(-x.rank, x.rank - 1)
            keep = b.integer(0, 1)
            a = axis % x.rank
            shape = tuple(1 if i == a else d for i, d in enumerate(x.shape) if keep or i != a)
            return b.one(b.pick(["ArgMax", "ArgMin"]), [x], I64, shape, scale=x.shape[a], axis=axis, keepdims=keep)
        if kind == "cast" and floats:
            x = b.pick(floats)
            if x.massive:
                return None
            return b.one("Cast", [x], I64, x.shape, scale=max(x.scale, 1) * 4, to=I64)
        if kind == "input":
            v = b.add_input(I64, small_shape(b, 1, 2))
            v.scale = 8
            return v
        return None

    # arithmetic and movement

    def step(self, x: Value) -> Value | None:
        """One op on ``x`` (arithmetic most often: where bounds are easy to get wrong)."""
        kind = self.b.pick(
            ["arith"] * 8
            + ["div", "mod", "mod", "unary", "clip", "reshape", "transpose", "expand", "tile", "slice", "gather"]
            + ["concat", "where", "reduce", "cumsum", "unsqueeze", "squeeze"]
        )
        if x.from_shape and kind in ("reshape", "expand", "tile", "gather", "unsqueeze", "squeeze", "reduce"):
            return None  # shape values keep their rank (see Value.from_shape)
        return getattr(self, kind)(x)

    def partner(self, x: Value) -> Value:
        b = self.b
        same = [
            v
            for v in b.pool
            if v.dtype == I64
            and _broadcasts_to(v.shape, x.shape)
            and v is not x
            and (v.shape == x.shape or not (v.from_shape or x.from_shape))
        ]
        if same and b.coin(0.4):
            return b.pick(same)
        return self.constant(broadcast_partner(b, x.shape))

    def constant(self, shape) -> Value:
        """An int64 constant whose values lie in a drawn, often lopsided, range (-70000..5, 0..2**20,
        sometimes beyond int32): where interval arithmetic must get its signs right."""
        b = self.b
        magnitudes = [1, 4, 100, 70000, 70000, 2**20, 2**24] + (
            [2**31 + 5, 2**33, 3 * 10**9] if b.coin(self.big) else []
        )
        low = -b.pick(magnitudes) if b.coin(0.5) else b.pick([0, 1, 3])
        high = b.pick(magnitudes) if b.coin(0.7) else b.pick([-1, 0, 2, 5])
        low, high = min(low, high), max(low, high)
        array = b.random.integers(low, high + 1, shape).astype(np.int64)
        flat = array.reshape(-1)
        for end in (low, high):  # the range's ends are among the values: bounds are reached
            if flat.size and b.coin(0.7):
                flat[b.integer(0, flat.size - 1)] = end
        c = b.add_const(array, pooled=False)
        c.scale = max(abs(low), abs(high), 1)
        return c

    def arith(self, x: Value) -> Value | None:
        b = self.b
        op = b.pick(["Add", "Sub", "Mul", "Mul", "Max", "Min"])
        y = self.partner(x)
        scale = x.scale * y.scale if op == "Mul" else x.scale + y.scale
        if scale > INT_LIMIT:
            return None
        first, second = (x, y) if b.coin(0.7) else (y, x)
        return b.one(op, [first, second], I64, np.broadcast_shapes(x.shape, y.shape), scale=scale)

    def div(self, x: Value) -> Value:
        b = self.b
        divisor = b.pick([1, 2, 3, 7, -3])  # the sign matters: integer division rounds toward zero
        c = b.add_const(
            np.array(divisor, np.int64) if b.coin() else np.full(broadcast_partner(b, x.shape), divisor, np.int64),
            pooled=False,
        )
        return b.one("Div", [x, c], I64, np.broadcast_shapes(x.shape, c.shape), scale=x.scale)

    def mod(self, x: Value) -> Value:
        b = self.b
        divisor = b.pick([2, 3, 5, 16, 1000, -4])
        c = b.add_const(np.array(divisor, np.int64), pooled=False)
        return b.one("Mod", [x, c], I64, x.shape, scale=abs(divisor))

    def unary(self, x: Value) -> Value:
        return self.b.one(self.b.pick(["Neg", "Abs", "Identity"]), [x], I64, x.shape, scale=x.scale)

    def clip(self, x: Value) -> Value:
        b = self.b
        low, high = sorted(b.random.integers(-50, 50, 2))
        inputs = [
            x,
            b.add_const(np.array(low, np.int64), pooled=False),
            b.add_const(np.array(high, np.int64), pooled=False),
        ]
        return b.one("Clip", inputs if b.coin(0.8) else inputs[:2], I64, x.shape, scale=max(abs(low), abs(high), 1))

    def reshape(self, x: Value) -> Value:
        target, out = reshape_target(self.b, x.shape)
        return self.b.one("Reshape", [x, self.b.ints(target)], I64, out, scale=x.scale)

    def transpose(self, x: Value) -> Value | None:
        if x.rank < 2:
            return None
        perm = [int(p) for p in self.b.random.permutation(x.rank)]
        return self.b.one("Transpose", [x], I64, tuple(x.shape[p] for p in perm), scale=x.scale, perm=perm)

    def expand(self, x: Value) -> Value | None:
        b = self.b
        if x.rank >= 3:
            return None
        # Sometimes big: the index grids exporters make (and narrow_int64 exists for).
        lead = b.pick([1, 2, 3, 64]) if b.coin(0.8) else 1024
        shape = (lead,) + tuple(d if d != 1 else b.integer(1, 8) for d in x.shape)
        return b.one("Expand", [x, b.ints(list(shape))], I64, shape, scale=x.scale)

    def tile(self, x: Value) -> Value | None:
        b = self.b
        if not x.shape or x.size > 256:
            return None
        repeats = [b.integer(1, 3) for _ in x.shape]
        return b.one("Tile", [x, b.ints(repeats)], I64, tuple(d * r for d, r in zip(x.shape, repeats)), scale=x.scale)

    def slice(self, x: Value) -> Value | None:
        b = self.b
        if not x.shape:
            return None
        a = b.integer(0, x.rank - 1)
        start = b.integer(0, x.shape[a] - 1)
        stop = b.integer(start + 1, x.shape[a])
        shape = list(x.shape)
        shape[a] = stop - start
        return b.one("Slice", [x, b.ints([start]), b.ints([stop]), b.ints([a])], I64, shape, scale=x.scale)

    def gather(self, x: Value) -> Value | None:
        b = self.b
        if not x.shape:
            return None
        d = x.shape[0]
        indices = b.random.integers(-d, d, b.pick([(), (2,), (1, 3)])).astype(np.int64)
        return b.one("Gather", [x, b.ints(indices)], I64, indices.shape + x.shape[1:], scale=x.scale)

    def concat(self, x: Value) -> Value | None:
        b = self.b
        if not x.shape:
            return None
        y = self.partner(x)
        if y.shape != x.shape:
            y = b.add_const(np.zeros(x.shape, np.int64) + b.integer(0, 9), pooled=False)
        shape = (x.shape[0] + y.shape[0],) + x.shape[1:]
        return b.one("Concat", [x, y], I64, shape, scale=max(x.scale, y.scale), axis=0)

    def where(self, x: Value) -> Value:
        b = self.b
        y = self.partner(x)
        threshold = b.add_const(np.array(b.integer(0, 3), np.int64), pooled=False)
        cond = b.one("Greater", [x, threshold], BOOL, x.shape, pooled=False)
        return b.one("Where", [cond, x, y], I64, np.broadcast_shapes(x.shape, y.shape), scale=max(x.scale, y.scale))

    def reduce(self, x: Value) -> Value | None:
        b = self.b
        if not x.shape:
            return None
        op = b.pick(["ReduceMax", "ReduceMin", "ReduceSum"])
        a = b.integer(0, x.rank - 1)
        keep = b.integer(0, 1)
        shape = tuple(1 if i == a else d for i, d in enumerate(x.shape) if keep or i != a)
        scale = x.scale * x.shape[a] if op == "ReduceSum" else x.scale
        return b.one(op, [x, b.ints([a])], I64, shape, scale=scale, keepdims=keep)

    def cumsum(self, x: Value) -> Value | None:
        b = self.b
        if not x.shape:
            return None
        a = b.integer(-x.rank, x.rank - 1)
        attrs = {k: 1 for k in ("exclusive", "reverse") if b.coin(0.3)}
        axis = b.add_const(np.array(a, np.int64), pooled=False)
        return b.one("CumSum", [x, axis], I64, x.shape, scale=x.scale * x.shape[a], **attrs)

    def unsqueeze(self, x: Value) -> Value | None:
        if x.rank >= 3:
            return None
        return self.b.one("Unsqueeze", [x, self.b.ints([0])], I64, (1,) + x.shape, scale=x.scale)

    def squeeze(self, x: Value) -> Value | None:
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if not ones:
            return None
        return self.b.one(
            "Squeeze", [x, self.b.ints([ones[0]])], I64, x.shape[: ones[0]] + x.shape[ones[0] + 1 :], scale=x.scale
        )

    # where int32 would do

    def sink(self, x: Value) -> Value | None:
        """Read ``x`` as indices (made valid with Mod) or convert it to float."""
        b = self.b
        kind = b.pick(["gather", "gather", "gather_elements", "cast"])
        if kind == "cast":
            return b.one("Cast", [x], F32, x.shape, scale=float(x.scale), to=F32)
        if kind == "gather":
            d = b.integer(1, 6)
            table = b.add_const(normal(b, (d, b.integer(1, 3))), pooled=False) if b.coin(0.6) else None
            if table is None:
                floats = [v for v in b.pool if v.dtype == F32 and v.shape and not v.massive]
                if not floats:
                    return None
                table = b.pick(floats)
                d = table.shape[0]
            index = b.one("Mod", [x, b.add_const(np.array(d, np.int64), pooled=False)], I64, x.shape, scale=d)
            if b.coin(0.3):  # a negative index counts from the end
                index = b.one("Sub", [index, b.add_const(np.array(d, np.int64), pooled=False)], I64, x.shape, scale=d)
            return b.one("Gather", [table, index], F32, x.shape + table.shape[1:], scale=table.scale)
        if not x.shape:
            return None
        d = b.integer(1, 5)
        data_shape = x.shape[:-1] + (d,)
        data = b.add_const(normal(b, data_shape), pooled=False)
        index = b.one("Mod", [x, b.add_const(np.array(d, np.int64), pooled=False)], I64, x.shape, scale=d)
        return b.one("GatherElements", [data, index], F32, x.shape, scale=data.scale, axis=-1)


@seeded
def index_graphs(b: GraphBuilder, chains=(1, 3), length=(1, 5)) -> Case:
    """int64 index arithmetic (shapes, ranges, grids, argmax, constants sometimes beyond int32):
    chains from a source through arithmetic and data movement to a reader of indices (Gather,
    GatherElements) or a Cast, sharing values at times, next to some float computation; int64
    values are outputs too."""
    b.add_input(F32, small_shape(b, 1, 3))
    ints = IntOps(b)
    floats = FloatOps(b, casts=False)
    for _ in range(b.integer(*chains)):
        if b.coin(0.3):
            floats.step()
        value = None
        while value is None:
            value = ints.source()
        for _ in range(b.integer(*length)):
            value = ints.step(value) or value
        ints.sink(value)
    outputs = b.outputs((F32, I64))
    return Case(b.model(outputs), b.feeds())


@seeded
def folding_graphs(b: GraphBuilder, steps=(3, 10)) -> Case:
    """Graphs with constant subexpressions: float arithmetic, reductions and data movement on
    constants, index chains from Shape/Range/ConstantOfShape, grids made by Expand/Tile (some
    big: what the fold guard keeps computed), all mixed with what depends on the inputs."""
    b.add_input(F32, small_shape(b, 1, 3))
    floats = FloatOps(b)
    ints = IntOps(b, big=0.1)
    for _ in range(b.integer(1, 3)):  # constants for the float ops to compute on
        b.add_const(normal(b, small_shape(b, 0, 3)))
    for _ in range(b.integer(*steps)):
        kind = b.pick(["float", "float", "ints"])
        if kind == "float":
            constants = [v for v in b.readable((F32,)) if v.const is not None or not any(v is i for i in b.inputs)]
            floats.step() if not constants or b.coin(0.5) else _step_on(floats, b.pick(constants[-4:]))
        else:
            value = ints.source()
            for _ in range(b.integer(0, 3)):
                value = (ints.step(value) or value) if value is not None else None
            if value is not None:
                ints.sink(value)
    return Case(b.model(b.outputs((F32, I64))), b.feeds(), options={"max_growth": b.pick([0, 256, 4096, 2**20])})


def _step_on(ops: FloatOps, x: Value) -> None:
    """One float op on ``x`` (a constant, or what was computed from constants)."""
    ops.b.pick(
        [
            ops.unary,
            ops.binary,
            ops.divide,
            ops.matmul,
            ops.reshape,
            ops.transpose,
            ops.concat,
            ops.gather,
            ops.slice,
            ops.reduce,
            ops.softmax,
            ops.unsqueeze,
            ops.expand,
            ops.cast_chain,
        ]
    )(x)


@seeded
def double_graphs(b: GraphBuilder, steps=(2, 6)) -> Case:
    """Float graphs reading fp64 constants as exporters write them (a double constant, then Cast or
    CastLike to float), and fp64 constants that must stay fp64: read in double arithmetic, cast to
    fp16, graph outputs; values fp32 cannot hold exactly (tiny, huge, -0.0, NaN) among them."""
    x = b.add_input(F32, small_shape(b, 1, 3))
    wide = b.add_input(F64, x.shape) if b.coin(0.3) else None
    floats = FloatOps(b, casts=False)
    outputs: list[Value] = []
    for _ in range(b.integer(1, 4)):
        shape = broadcast_partner(b, x.shape)
        values = b.random.standard_normal(shape) * b.pick([1.0, 1e-3, 1e3])
        flat = values.reshape(-1)
        if flat.size and b.coin(0.4):  # what fp32 rounds, flushes, overflows or keeps as it is
            flat[b.integer(0, flat.size - 1)] = b.pick([1e-50, -1e-42, 3.4e39, -0.0, np.nan, np.inf, 1 / 3])
        d = b.add_const(values.astype(np.float64), pooled=False)
        readers = b.integer(1, 3)
        for _ in range(readers):
            kind = b.pick(["cast", "cast", "castlike", "double", "fp16"] + (["wide"] if wide is not None else []))
            if kind == "cast":
                y = b.one("Cast", [d], F32, d.shape, scale=1e3, to=F32, pooled=False)
            elif kind == "castlike":
                y = b.one("CastLike", [d, x], F32, d.shape, scale=1e3, pooled=False)
            elif kind == "fp16":
                half = b.one("Cast", [d], F16, d.shape, to=F16, pooled=False)
                y = b.one("Cast", [half], F32, d.shape, scale=1e3, to=F32, pooled=False)
            else:
                other = wide if kind == "wide" else d
                product = b.one("Mul", [d, other], F64, np.broadcast_shapes(d.shape, other.shape), pooled=False)
                y = b.one("Cast", [product], F32, product.shape, scale=1e3, to=F32, pooled=False)
            if b.coin(0.2):
                outputs.append(y)  # a Cast that is a graph output keeps its name
            else:
                z = b.one(b.pick(["Add", "Mul", "Sub"]), [x, y], F32, np.broadcast_shapes(x.shape, y.shape), scale=1e3)
                outputs.append(z)
        if b.coin(0.1):
            outputs.append(d)  # a double output: kept as it is
    for _ in range(b.integer(*steps) - 2):
        floats.step()
    chosen = list(dict.fromkeys(v.name for v in outputs))
    return Case(b.model([next(v for v in outputs if v.name == n) for n in chosen]), b.feeds())


@seeded
def token_graphs(b: GraphBuilder, steps=(1, 6)) -> Case:
    """Transformer-like graphs on [batch, tokens, features]: per-token ops (MatMul by a weight, bias,
    LayerNorm, activations, softmax over features, residual Adds), ops that mix tokens (softmax or
    reductions over them, transposes, Concat along them), then a row selection (Gather or Slice on
    the tokens axis: the CLS token, the last token, a window), sometimes more per-token ops after it."""
    batch, tokens, features = b.integer(1, 2), b.integer(2, 6), b.integer(2, 6)
    rank3 = b.coin(0.8)
    shape = (batch, tokens, features) if rank3 else (tokens, features)
    x = b.add_input(F32, shape)
    h = x
    for _ in range(b.integer(*steps)):
        h = _token_op(b, h) or h
    selected = _select_rows(b, h)
    for _ in range(b.integer(0, 2)):
        if selected.rank >= 2:
            selected = _token_op(b, selected, mixing=False) or selected
    outputs = [selected]
    if b.coin(0.2):
        outputs.append(h)  # every row is read after all
    return Case(b.model(outputs), b.feeds())


def _token_op(b: GraphBuilder, h: Value, *, mixing: bool = True) -> Value | None:
    d = h.shape[-1]
    kinds = ["matmul", "matmul", "bias", "residual", "layer_norm", "unary", "softmax", "scale"]
    if mixing:
        kinds += ["mix", "token_mean", "token_softmax", "concat_tokens"]
    kind = b.pick(kinds)
    if kind == "matmul":
        out = b.integer(2, 6)
        w = b.add_const(normal(b, (d, out), 1 / math.sqrt(d)))
        return b.one("MatMul", [h, w], F32, h.shape[:-1] + (out,))
    if kind == "bias":
        c = b.add_const(normal(b, b.pick([(d,), (1, 1, d)[-h.rank :], ()])))
        return b.one(b.pick(["Add", "Sub", "Mul"]), [h, c], F32, h.shape)
    if kind == "residual":
        same = [v for v in b.pool if v.dtype == F32 and v.shape == h.shape and v is not h]
        other = b.pick(same) if same else b.add_const(normal(b, h.shape))
        return b.one("Add", [h, other] if b.coin() else [other, h], F32, h.shape)
    if kind == "layer_norm":
        return FloatOps(b).layer_norm(h)
    if kind == "unary":
        return b.one(b.pick(["Relu", "Tanh", "Sigmoid", "Erf", "Neg", "Abs", "Softplus"]), [h], F32, h.shape)
    if kind == "softmax":
        return b.one("Softmax", [h], F32, h.shape, axis=b.pick([-1, h.rank - 1]))
    if kind == "scale":
        return b.one("Mul", [h, b.add_const(np.array(0.5, np.float32))], F32, h.shape)
    if kind == "mix":  # tokens attend to tokens: x^T W over the tokens axis
        perm = list(range(h.rank))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        t = b.one("Transpose", [h], F32, tuple(h.shape[p] for p in perm), perm=perm)
        tokens = h.shape[-2]
        mixed = b.one("MatMul", [t, b.add_const(normal(b, (tokens, tokens), 0.5))], F32, t.shape)
        return b.one("Transpose", [mixed], F32, h.shape, perm=perm)
    if kind == "token_mean":  # [.., 1, d]: broadcast back over the tokens
        mean = b.one("ReduceMean", [h, b.ints([h.rank - 2])], F32, h.shape[:-2] + (1, d), keepdims=1)
        return b.one("Sub", [h, mean], F32, h.shape)
    if kind == "token_softmax":
        return b.one("Softmax", [h], F32, h.shape, axis=h.rank - 2)
    if kind == "concat_tokens":  # a CLS token in front
        cls = b.add_const(normal(b, h.shape[:-2] + (1, d)))
        shape = h.shape[:-2] + (h.shape[-2] + 1, d)
        return b.one("Concat", [cls, h], F32, shape, axis=h.rank - 2)
    return None


def _select_rows(b: GraphBuilder, h: Value) -> Value:
    tokens = h.shape[-2]
    axis = b.pick([h.rank - 2, -2])
    if b.coin(0.6):
        index = b.pick([0, 0, -1, tokens - 1, b.integer(-tokens, tokens - 1)])
        indices = np.array(index, np.int64) if b.coin(0.7) else np.array([index, b.integer(0, tokens - 1)], np.int64)
        shape = h.shape[:-2] + indices.shape + h.shape[-1:]
        return b.one("Gather", [h, b.add_const(indices, pooled=False)], F32, shape, axis=axis)
    start = b.integer(-tokens, tokens - 1)
    first = start % tokens
    stop = b.integer(first + 1, tokens)
    ends = stop if stop < tokens or b.coin() else 2**31
    inputs = [h, b.ints([start]), b.ints([ends]), b.ints([axis])]
    if b.coin(0.5):
        inputs.append(b.ints([1]))
    shape = h.shape[:-2] + (stop - first, h.shape[-1])
    return b.one("Slice", inputs, F32, shape)


@seeded
def duplicate_graphs(b: GraphBuilder, steps=(2, 8)) -> Case:
    """Float graphs whose constants repeat: the same tensor as initializers and Constant nodes,
    in subgraphs too, next to near-twins that must stay apart (same bytes in another shape or
    dtype, -0.0 beside 0.0, NaNs), a constant that is a graph output, one that is an input."""
    x = b.add_input(F32, small_shape(b, 1, 3))
    floats = FloatOps(b)
    for _ in range(b.integer(*steps)):
        kind = b.pick(["op", "op", "twin", "twin", "twin", "near_twin", "near_twin", "if"])
        if kind == "op":
            floats.step()
        elif kind == "if":
            floats.if_node()
        elif kind in ("twin", "near_twin"):
            originals = [c for c in b.constants if c.const.size and c.const.dtype != np.int64] or [
                b.add_const(normal(b, broadcast_partner(b, x.shape)), share=False)
            ]
            original = b.pick(originals)
            array = original.const.copy() if kind == "twin" else _near_twin(b, original.const)
            copy = b.add_const(array, share=False, pooled=False)
            if copy.dtype == F32 and _broadcasts_to(copy.shape, x.shape):
                b.one(b.pick(["Add", "Mul"]), [x, copy], F32, x.shape)
            elif copy.dtype == F32:
                b.one("Relu", [copy], F32, copy.shape)  # a constant subexpression reading it
            else:
                b.one("Cast", [copy], F32, copy.shape, to=F32)
    outputs = b.outputs((F32,))
    if b.constants and b.coin(0.15):
        outputs.append(b.pick(b.constants))
    model = b.model(list({v.name: v for v in outputs}.values()))
    if b.coin(0.15):  # an initializer that is also an input: its value may be fed, so never merged
        listed = [i for i in model.graph.initializer if i.data_type == F32]
        if listed:
            init = b.pick(listed)
            model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return Case(model, b.feeds())


def _near_twin(b: GraphBuilder, array: np.ndarray) -> np.ndarray:
    """Almost ``array``: the same bytes in another shape or dtype, or a -0.0 / NaN in it."""
    kind = b.pick(["shape", "dtype", "signed_zero", "nan"])
    if kind == "shape" and array.ndim:
        return array.reshape(-1) if array.ndim > 1 else array.reshape(1, -1)
    if kind == "dtype" and array.dtype == np.float32:
        return array.view(np.int32).copy()
    twin = array.astype(np.float32).copy()
    flat = twin.reshape(-1)
    flat[b.integer(0, flat.size - 1)] = -0.0 if kind == "signed_zero" else np.nan
    return twin
