"""The fp16 island policy: which tensors and ops must stay fp32, and why.

One place decides it, from two sources:

* Measurement. The source is run on calibration inputs and each float tensor's
  largest |x| recorded (:mod:`onnxsmith.probes.ranges`). A tensor whose range
  is over the safe limit — fp16's largest finite value, 65,504, divided by a
  headroom factor (4 by default, for inputs the calibration did not see) — is
  kept in fp32, and so is one whose nonzero values mostly fall below fp16's
  smallest normal (2**-14), where fp16 keeps almost no precision. A node that
  produces or reads such a tensor computes in fp32: that is an island.
  Constants are checked from their values: over fp16's max (no headroom: they
  cannot grow), or, rounded to fp16, off as a whole by more than 2**-5
  (||w16 - w|| / ||w||: under 4 significant bits, what a value below 2**-20 keeps as
  an fp16 subnormal; an epsilon of 1e-5 is fine, a clamp at 1e-9 would vanish).
  The tensor is judged by what it computes, not by its smallest values: a trained
  weight whose dead channels hold 1e-20 loses nothing that matters when they flush
  to zero.

* What fp16 kernels do. onnxruntime's CUDA kernels for MatMul/Gemm (cuBLAS),
  Conv (cuDNN), Softmax, LayerNormalization and the attention contrib ops take
  fp16 in and out but accumulate in fp32, so they are safe in fp16 whenever
  their inputs and outputs fit — which measurement checks. Reductions over an
  axis of unbounded length are not: partial sums can leave fp16's range while
  the result fits (a mean of 1e4 values of 100), fp16 CumSum accumulates in
  fp16, and a sum of squares (a hand-built LayerNorm's variance) overflows
  long before a LayerNorm's input does. They are memory-bound, so fp32 costs
  little: :data:`ACCUMULATING_OPS` stay fp32 always. Max/min reductions do not
  accumulate and stay eligible. Recurrent cells (:data:`RECURRENT_OPS`: LSTM,
  GRU, RNN) feed their own rounded state back step after step, so fp16 error
  compounds with sequence length; they are small and sequential, fp16 buys
  little there, and they stay fp32 too.

* Cost. fp16 pays on big tensors (half the memory traffic, tensor-core MatMuls)
  and big weights (half the file). A node whose float outputs are all tiny next
  to the model's largest activation (:data:`SMALL_SHARE` of its elements, at the
  calibration shapes) — a readout on the pooled CLS token, a squeeze-excitation
  gate — gains nothing measurable from fp16, while its rounding reaches the
  outputs undamped: it stays fp32 (only the node; its readers may still read it
  in fp16). Three things keep the rule honest. A weight computed at run time
  (a Transpose or an Identity of a shared weight) is a weight, not an activation:
  it is never "the largest activation". Sizes at one calibration shape are
  only evidence for other shapes when the tensor grows no faster than the
  largest activation with the model's symbolic dims (attention scores
  ``[heads, seq, seq]`` are tiny next to ``[seq, 3072]`` at 8 tokens, not at
  512): when both shapes are known that is checked. And the rule is a cost
  rule: a node it keeps reads at most :data:`SMALL_WEIGHT_SHARE` of the model's
  weight bytes (weights read through such run-time copies included), and all the
  nodes it keeps together at most :data:`SMALL_WEIGHTS_TOTAL` (the smallest first;
  a weight shared by many nodes counted once), so it can never keep a
  transformer's projections fp32 and the file nearly full size.
  Pure data movement (:data:`MOVEMENT_OPS`) costs the same in any precision and
  follows its input instead.

bf16 has fp32's exponent range: nothing overflows or underflows it, so only the
op policy applies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxsmith.analysis.measurements import TensorRange
from onnxsmith.core.limits import FP16_MAX, FP16_MIN_NORMAL
from onnxsmith.irutil.walk import reachable
from onnxsmith.settings.fp16 import DEFAULT_HEADROOM

#: Keep fp32 when more than this share of a tensor's nonzero values is below fp16's smallest normal.
UNDERFLOW_SHARE = 0.5

#: Reductions whose running sums can leave fp16's range while their result fits (see module doc).
ACCUMULATING_OPS = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceProd",
        "CumSum",
    }
)

#: A node whose float outputs each have at most this share of the largest activation's elements
#: stays fp32, as long as all such nodes together hold at most SMALL_WEIGHT_SHARE of the weight bytes.
SMALL_SHARE = 1 / 64
SMALL_WEIGHT_SHARE = 1 / 100
#: All the nodes the cost rule keeps fp32 hold at most this share of the model's weight bytes.
SMALL_WEIGHTS_TOTAL = 1 / 20

#: Ops that only move or select data: they take the precision of the value they move.
MOVEMENT_OPS = frozenset(
    {
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Identity",
        "Slice",
        "Gather",
        "GatherElements",
        "GatherND",
        "Split",
        "Concat",
        "Expand",
        "Tile",
        "Pad",
        "DepthToSpace",
        "SpaceToDepth",
        "ScatterND",
        "ScatterElements",
        "ReverseSequence",
        "Compress",
        "Dropout",
    }
)

#: Recurrent ops carry state from step to step, where fp16 rounding compounds (see module doc).
RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})

#: A constant rounded to fp16 may be off by at most this share of its size (||w16 - w|| / ||w||):
#: what a single value of 2**-20 is off by as an fp16 subnormal (under 4 significant bits).
CONSTANT_ROUNDING = 2.0**-5

#: Constants bigger than this are checked for underflow on an evenly strided sample.
_SAMPLE_ABOVE = 1 << 20


@dataclass(frozen=True)
class Limits:
    """When a tensor is unsafe in the low-precision type."""

    max_abs: float  # largest |x| allowed for a measured activation (headroom included)
    finite_max: float  # largest finite value of the type (for constants)
    min_normal: float | None  # smallest normal of the type; None: underflow is no concern
    underflow_share: float = UNDERFLOW_SHARE

    @classmethod
    def for_dtype(cls, dtype: ir.DataType, headroom: float = DEFAULT_HEADROOM) -> Limits:
        if dtype == ir.DataType.BFLOAT16:
            big = float(np.finfo(np.float32).max)
            return cls(max_abs=big, finite_max=big, min_normal=None)
        return cls(max_abs=FP16_MAX / headroom, finite_max=FP16_MAX, min_normal=FP16_MIN_NORMAL)


@dataclass(frozen=True)
class Unsafe:
    """A tensor that must stay fp32, with the measurement that says so."""

    name: str
    absmax: float
    tiny_fraction: float
    reason: str  # one line: "max |x| 1.4e+05 > 16,376"


def unsafe_activations(
    ranges: list[TensorRange], limits: Limits, *, scale: dict[str, float] | None = None
) -> dict[str, Unsafe]:
    """Measured tensors over the limit or underflowing; ``scale`` multiplies a tensor's measured range
    (a tensor the residual rescaling carries scaled)."""
    unsafe = {}
    for r in ranges:
        factor = (scale or {}).get(r.name, 1.0)
        absmax = r.absmax * factor
        if absmax > limits.max_abs:
            unsafe[r.name] = Unsafe(r.name, absmax, r.tiny_fraction, f"max |x| {absmax:.3g} > {limits.max_abs:,.0f}")
        elif limits.min_normal is not None and factor == 1.0 and r.tiny_fraction > limits.underflow_share:
            unsafe[r.name] = Unsafe(
                r.name,
                absmax,
                r.tiny_fraction,
                f"{r.tiny_fraction:.0%} of its nonzero values are below fp16's smallest normal",
            )
    return unsafe


def unsafe_constant(tensor: ir.TensorProtocol, limits: Limits) -> str | None:
    """Why a constant cannot be stored in the low-precision type, or None."""
    array = tensor.numpy()
    try:
        if array.size == 0:
            return None
        flat = array.reshape(-1)
        peak = max(float(flat.max()), -float(flat.min()))  # NaN or inf anywhere shows here
        if not np.isfinite(peak):  # rare: look at the finite values only
            flat = flat[np.isfinite(flat)]
            if flat.size == 0:
                return None
            peak = max(float(flat.max()), -float(flat.min()))
        if peak > limits.finite_max:
            return f"holds {peak:.3g}, beyond the type's largest finite value {limits.finite_max:,.0f}"
        if limits.min_normal is None:
            return None
        sample = flat if flat.size <= _SAMPLE_ABOVE else flat[:: flat.size // _SAMPLE_ABOVE]
        if _rounding_bound_holds(sample, limits.min_normal):
            return None
        error = rounding_error(sample)
        if error > CONSTANT_ROUNDING:
            return (
                f"rounded to fp16 is off by {error:.2g} of its size (||w16 - w|| / ||w|| > 2^-5): its values "
                "lie below fp16's normal range, where it keeps under 4 significant bits"
            )
        return None
    finally:
        del array
        _release(tensor)


def _rounding_bound_holds(values: np.ndarray, min_normal: float) -> bool:
    """Whether ||fp16(values) - values|| / ||values|| <= CONSTANT_ROUNDING follows from the RMS alone.

    fp16 rounds a normal value within u = 2^-11 of it and a smaller one within min_normal * u, so
    ||Δ||^2 <= u^2 ||w||^2 + n (min_normal u)^2: the bound holds when the mean square is at least
    (min_normal u)^2 / (CONSTANT_ROUNDING^2 - u^2), about (1e-6)^2. One dot product instead of
    rounding a copy, for nearly every weight of a model (the ViT-L's 1.2 GB in a fraction of the time).
    """
    u = 2.0**-11
    floor = (min_normal * u) ** 2 / (CONSTANT_ROUNDING**2 - u**2)
    values = values.astype(np.float32, copy=False)
    mean_square = float(np.dot(values, values)) / values.size
    return bool(np.isfinite(mean_square)) and mean_square >= floor


def rounding_error(values: np.ndarray) -> float:
    """||fp16(values) - values|| / ||values|| (0 for all zeros): how far fp16 storage moves the tensor as a whole."""
    exact = values.astype(np.float64)
    norm = float(np.linalg.norm(exact))
    if norm == 0.0:
        return 0.0
    return float(np.linalg.norm(values.astype(np.float16).astype(np.float64) - exact)) / norm


def _release(tensor: ir.TensorProtocol) -> None:
    """Unmap an external tensor's pages once read, so checking a big model stays small."""
    if isinstance(tensor, ir.ExternalTensor):
        try:
            tensor.release()
        except BufferError:  # someone else still holds a view
            pass


def policy_reason(node: ir.Node) -> str | None:
    """Why the op policy keeps ``node`` in fp32 whatever the ranges, or None."""
    if node.domain in ("", "ai.onnx") and node.op_type in ACCUMULATING_OPS:
        return f"{node.op_type} accumulates over an axis (kept fp32 by policy)"
    if node.domain in ("", "ai.onnx") and node.op_type in RECURRENT_OPS:
        return f"{node.op_type} carries its state across time steps (kept fp32 by policy)"
    return None


class SmallNodes:
    """The cost rule (see the module docstring): which nodes are too small for fp16 to pay."""

    def __init__(
        self,
        model: ir.Model,
        ranges: list[TensorRange],
        *,
        share: float = SMALL_SHARE,
        weight_share: float = SMALL_WEIGHT_SHARE,
        weights_total: float = SMALL_WEIGHTS_TOTAL,
    ) -> None:
        self._computed = computed_from_constants(model.graph)
        activations = [r for r in ranges if r.elements > 0 and r.name not in self._computed]
        largest = max(activations, key=lambda r: r.elements, default=None)
        shapes = {v.name: v.shape for v in model.graph.inputs}
        shapes.update({out.name: out.shape for node in model.graph for out in node.outputs})
        #: measured tensor -> "128 elements, 1/1,176 of the largest activation"
        self.tensors = {
            r.name: f"{r.elements:,} elements, 1/{largest.elements // r.elements:,} of the largest activation"
            for r in activations
            if r.elements <= largest.elements * share and _grows_no_faster(shapes.get(r.name), shapes.get(largest.name))
        }
        self._bytes: dict[ir.Value, int] = {}
        for graph in model.graphs():
            for value in graph.initializers.values():
                self._bytes[value] = _weight_bytes(value)
            for node in graph:
                if _is_constant(node):
                    self._bytes[node.outputs[0]] = _weight_bytes(node.outputs[0])
        total = sum(self._bytes.values())
        self._node_limit = total * weight_share
        self.budget = total * weights_total

    def is_small(self, node: ir.Node) -> bool:
        if node.op_type in MOVEMENT_OPS and node.domain in ("", "ai.onnx"):
            return False
        floats = [out for out in node.outputs if out.dtype in _FLOATS]
        return bool(floats) and all(out.name in self.tensors for out in floats)

    def decide(self, nodes: list[ir.Node]) -> dict[ir.Node, str]:
        """The nodes of ``nodes`` the rule keeps fp32, with why: small ones reading few weights, the fewest
        weight bytes first, while all the weights they hold together stay within the budget."""
        candidates = []
        for index, node in enumerate(nodes):
            if self.is_small(node):
                weights = self.weights(node)
                size = sum(self._bytes[w] for w in weights)
                if size <= self._node_limit:
                    candidates.append((size, index, weights, node))
        candidates.sort(key=lambda c: c[:2])
        held: set[ir.Value] = set()
        spent = 0
        chosen: dict[ir.Node, str] = {}
        for _, _, weights, node in candidates:
            cost = sum(self._bytes[w] for w in weights - held)
            if spent + cost > self.budget:
                continue
            held |= weights
            spent += cost
            first = next(out for out in node.outputs if out.dtype in _FLOATS)
            chosen[node] = f"small: {self.tensors[first.name]}"
        return chosen

    def weights(self, node: ir.Node) -> set[ir.Value]:
        return weights_read(node, self._computed)


def weights_read(node: ir.Node, computed: set[str]) -> set[ir.Value]:
    """The float weights ``node`` reads, directly or through the nodes that compute ``computed``
    (:func:`computed_from_constants`: an Identity or a Transpose of a weight)."""

    def step(value: ir.Value) -> list[ir.Value]:
        producer = value.producer()
        if _weight_bytes(value) or value.name not in computed or producer is None:
            return []
        return [v for v in producer.inputs if v is not None]

    return {v for v in reachable((v for v in node.inputs if v is not None), step) if _weight_bytes(v)}


_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and bool(node.outputs)


def _weight_bytes(value: ir.Value) -> int:
    tensor = value.const_value if value.is_initializer() else None
    producer = value.producer()
    if tensor is None and producer is not None and _is_constant(producer):
        attr = producer.attributes.get("value")
        tensor = attr.value if attr is not None and attr.type == ir.AttributeType.TENSOR else None
    return tensor.nbytes if tensor is not None and tensor.dtype in _FLOATS else 0


def constant_names(model: ir.Model) -> set[str]:
    """Names of every weight in ``model``, in any graph: initializers and Constant nodes' outputs."""
    names = set()
    for graph in model.graphs():
        names.update(v.name for v in graph.initializers.values() if not v.is_graph_input())
        names.update(out.name for node in graph if _is_constant(node) for out in node.outputs)
    return names


def computed_from_constants(graph: ir.Graph, outer: Collection[str] = ()) -> set[str]:
    """Names of the values ``graph`` computes from its weights alone (an Identity, a Transpose of one).

    ``outer``: names of constants (and values computed from them) that a subgraph reads from the
    graphs around it (an LSTM inside an If branch slicing the main graph's weights).
    """
    constant = {v.name for v in graph.initializers.values() if not v.is_graph_input()} | set(outer)
    computed: set[str] = set()
    for node in graph:
        if _is_constant(node):
            constant.update(out.name for out in node.outputs)
            continue
        reads = [v for v in node.inputs if v is not None]
        subgraphs = any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())
        if reads and not subgraphs and all(v.name in constant or v.name in computed for v in reads):
            computed.update(out.name for out in node.outputs if out.name)
    return computed


def _grows_no_faster(shape: ir.Shape | None, largest: ir.Shape | None) -> bool:
    """Whether a tensor's size, as the symbolic dims grow, keeps at most its calibration share of the largest
    activation's: its symbolic dims are among the largest's. Unknown shapes or dims: the measured sizes decide."""
    mine, theirs = _symbolic_dims(shape), _symbolic_dims(largest)
    if mine is None or theirs is None:
        return True
    return not (mine - theirs)


def _symbolic_dims(shape: ir.Shape | None) -> Counter | None:
    if shape is None:
        return None
    dims: Counter = Counter()
    for dim in shape:
        if isinstance(dim, int):
            continue
        name = dim.value
        if not name or name.startswith("unk__"):
            return None
        dims[name] += 1
    return dims
