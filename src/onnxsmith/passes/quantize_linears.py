"""Linear layers (MatMul/Gemm by a constant weight) in int8 for onnxruntime's CPU provider.

``x @ W (+ b)`` becomes ``MatMulIntegerToFloat(xq, Wq, x_scale, w_scale, x_zero_point, w_zero_point, b)``
after one ``DynamicQuantizeLinear(x) -> xq, x_scale, x_zero_point``: the weight 8-bit, symmetric, one scale
per output column, stored quantized (the integers and their scales are what the file holds) as int8 whose
pairs along K stay within ``PAIR_LIMIT`` or, ``wide``, as uint8 with zero point 128 in all 8 bits (both
exact on every CPU: passes/quantization.py says why full-range int8 is not; uint8 x uint8 runs a slower GEMM,
docs/int8.md has what each costs); the activation quantized per tensor to uint8 at run time (no
calibrated scale to go stale). Linears reading the same input share its quantization (the
query, key and value projections quantize their input once). On AVX-512 VNNI / AMX CPUs this was
onnxruntime's fastest int8 form for transformer shapes (measured with int8 weights), and sharing the
quantization beats com.microsoft DynamicQuantizeMatMul per Linear (docs/int8.md has the measurements).

Optionally an input is *smoothed* (SmoothQuant): ``x' = x / s`` per input channel and
``W' = diag(s) W`` for every Linear reading it, the same products, with an outlier channel's
range moved into the weights, where per-column scales absorb it. The division is one Mul,
shared by the Linears that read the same input with the same ``s``; where the input is a
LayerNormalization's (or SkipLayerNormalization's) output that nothing else reads, the
division is folded into its scale and bias instead, and no Mul remains (pre-LN blocks).

An input channel with outliers far above every other channel's (a token-specific activation: a
BERT's FFN unit that fires ~20 on CLS/SEP only) sets the per-tensor activation scale for all of
them. Such channels can be kept *out* of the int8 product: the Mul zeroes them (its factor is 0
there, folded into a LayerNorm like smoothing where it can be), their weight rows are zero in the
int8 weight, and ``Gather(x, channels, axis=-1) @ W[channels]`` adds them back in fp32 (a [rows, k]
by [k, N] product beside the int8 GEMM; LLM.int8()'s decomposition with the channels fixed from
measured ranges).

Two options for every Linear (:class:`Int8Form`): the activation quantized in two passes
(``x ≈ Q(x) + Q(x - Q(x))``, two MatMulIntegerToFloat and an Add), and int8 weights rounded
elsewhere (error-compensated from the calibration inputs) instead of to nearest.

The pass only rewrites what its plan names (node -> :class:`LinearPlan`); which Linears go
int8, and with what smoothing, is decided from measurements elsewhere. It never runs a model.
A weight read by several planned Linears with the same smoothing is quantized once and shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.casts import insert_after_producer
from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer, tensor_dims
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes import quantization as qz

MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class Linear:
    """A MatMul/Gemm by a constant 2-D float weight, with the bias Add that follows it if any."""

    node: ir.Node
    weight: ir.Value  # as stored: [K, N], or [N, K] for a Gemm with transB
    transposed: bool  # Gemm transB: the stored weight is [N, K]
    bias: ir.Value | None  # constant [N] (Gemm's C, or the Add after a MatMul)
    bias_add: ir.Node | None  # the Add that adds it to a MatMul's product
    output: ir.Value  # what the Linear (with its bias) computes

    @property
    def input(self) -> ir.Value:
        x = self.node.inputs[0]
        assert x is not None  # find_linears
        return x

    @property
    def name(self) -> str:
        name = self.node.name or self.output.name
        assert name is not None  # onnx-ir names the values of a graph
        return name

    def kn(self) -> tuple[int, int]:
        k, n = tensor_dims(_stored(self.weight))
        return (n, k) if self.transposed else (k, n)

    def weight_array(self) -> np.ndarray:
        """The weight as [K, N] float32."""
        w: np.ndarray = const_array(self.weight).astype(np.float32)
        return w.T if self.transposed else w


def _stored(value: ir.Value) -> ir.TensorProtocol:
    """What a constant :func:`find_linears` found holds (its weight or bias)."""
    tensor = value.const_value
    assert tensor is not None
    return tensor


def find_linears(model: ir.Model) -> list[Linear]:
    """Every MatMul / Gemm of the main graph whose B is a constant 2-D fp32 weight, in graph order."""
    found = []
    for node in model.graph:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
            continue
        weight = _behind_identities(node.inputs[1])
        if weight is None or weight.const_value is None or weight.const_value.dtype != ir.DataType.FLOAT:
            continue
        if len(weight.const_value.shape) != 2 or node.inputs[0] is None:
            continue
        bias, bias_add, output, transposed = None, None, node.outputs[0], False
        if node.op_type == "Gemm":
            attrs = node.attributes
            if attrs.get_int("transA", 0) or attrs.get_float("alpha", 1.0) != 1.0:
                continue
            transposed = bool(attrs.get_int("transB", 0))
            if len(node.inputs) > 2 and node.inputs[2] is not None:
                if attrs.get_float("beta", 1.0) != 1.0 or not _is_vector(node.inputs[2], weight, transposed):
                    continue
                bias = node.inputs[2]
        else:
            uses = list(output.uses())
            if len(uses) == 1 and not output.is_graph_output():
                user, index = uses[0]
                other = user.inputs[1 - index] if len(user.inputs) == 2 else None
                if (
                    user.op_type == "Add"
                    and user.domain in ("", "ai.onnx")
                    and other is not None
                    and _is_vector(other, weight, False)
                ):
                    bias, bias_add, output = other, user, user.outputs[0]
        found.append(Linear(node, weight, transposed, bias, bias_add, output))
    return found


def _behind_identities(value: ir.Value | None) -> ir.Value | None:
    """The value an Identity chain passes on: torch's exporters give each further reader of a shared weight
    (ALBERT's layers) an Identity of it; read through, the weight's int8 copy replaces its fp32 one."""
    while value is not None and value.const_value is None:
        producer = value.producer()
        if producer is None or producer.op_type != "Identity" or producer.domain not in ("", "ai.onnx"):
            break
        value = producer.inputs[0]
    return value


def _is_vector(value: ir.Value, weight: ir.Value, transposed: bool) -> bool:
    """A constant fp32 [N] (or [1, N]) vector matching the weight's output columns."""
    tensor = value.const_value
    if tensor is None or tensor.dtype != ir.DataType.FLOAT:
        return False
    n = _stored(weight).shape[0 if transposed else 1]
    return tuple(tensor.shape) in ((n,), (1, n))


def shared_weights(linears: Iterable[Linear]) -> set[ir.Value]:
    """The weights that Linears reading different inputs share (ALBERT's layers), read the same way (their int8
    copy can then be one): each is stored int8 once, so it takes one form and one rounding for all of them."""
    readers: dict[ir.Value, list[Linear]] = {}
    for linear in linears:
        readers.setdefault(linear.weight, []).append(linear)
    return {
        weight
        for weight, group in readers.items()
        if len({r.input for r in group}) > 1 and len({(r.transposed, r.kn()) for r in group}) == 1
    }


def by_input(linears: Iterable[Linear]) -> dict[ir.Value, list[Linear]]:
    """The Linears grouped by the value they read (graph order): they share a smoothing and a quantization."""
    groups: dict[ir.Value, list[Linear]] = {}
    for linear in linears:
        groups.setdefault(linear.input, []).append(linear)
    return groups


def smoothing_factors(channel_absmax: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """SmoothQuant's ``s_j = max|x_j|^alpha / max|W_j,:|^(1 - alpha)`` per input channel (1 where either is 0).

    ``weights`` are the [K, N] weights of every Linear that reads the input: one ``s`` serves all.
    """
    x = np.asarray(channel_absmax, dtype=np.float64)
    wmax = np.max([np.abs(w.astype(np.float64)).max(axis=1) for w in weights], axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(x, alpha) / np.power(wmax, 1.0 - alpha)
    s = np.where((x > 0) & (wmax > 0) & np.isfinite(s), s, 1.0)
    return np.clip(s, 1e-4, 1e4).astype(np.float32)


#: At most this many outlier channels are kept out of an int8 product.
MAX_OUTLIERS = 8
#: ... and only if the rest's range is this many times smaller than the input's.
OUTLIER_GAIN = 4.0


def outlier_channels(channel_absmax: np.ndarray) -> tuple[int, ...]:
    """The fewest input channels (largest first, at most MAX_OUTLIERS) whose removal brings the per-tensor range
    within 2x of what removing MAX_OUTLIERS would: () unless that shrinks the range OUTLIER_GAIN times."""
    x = np.asarray(channel_absmax, dtype=np.float64)
    if x.size <= 2 * MAX_OUTLIERS:
        return ()
    order = np.argsort(-x, kind="stable")
    peaks = x[order]
    floor = peaks[MAX_OUTLIERS]
    k = next(k for k in range(1, MAX_OUTLIERS + 1) if peaks[k] <= 2.0 * floor)
    if not peaks[0] >= OUTLIER_GAIN * peaks[k]:
        return ()
    return tuple(sorted(int(c) for c in order[:k]))


#: What makes two plans prepare an input (:meth:`LinearPlan.input_key`): smoothing factors, outlier channels.
InputKey = tuple[bytes | None, tuple[int, ...]]
#: ... and its weights the same way too (:meth:`LinearPlan.key`): and whether they are wide.
PlanKey = tuple[InputKey, bool]


@dataclass(frozen=True)
class LinearPlan:
    """How one Linear goes int8: smoothing factors per input channel (or none), the input channels kept out of
    the int8 product and multiplied in fp32 beside it (outliers; none by default), and its weights ``wide``:
    all 8 bits, stored uint8 with zero point 128 and run by onnxruntime's slower uint8 x uint8 GEMM, where
    by default they are int8 within pairs (passes/quantization.py says why both are exact on every CPU)."""

    smoothing: np.ndarray | None = None
    outliers: tuple[int, ...] = ()
    wide: bool = False

    @property
    def prepares_input(self) -> bool:
        """Whether a Mul prepares the input (smoothing factors, outlier channels zeroed) before it is quantized."""
        return self.smoothing is not None or bool(self.outliers)

    @property
    def plain(self) -> bool:
        """The default form: the input quantized as it is, int8 weights in pairs."""
        return not self.prepares_input and not self.wide

    def input_key(self) -> InputKey:
        """What makes two plans prepare an input the same way."""
        return (None if self.smoothing is None else self.smoothing.tobytes(), self.outliers)

    def key(self) -> PlanKey:
        """What makes two plans prepare an input and its weights the same way."""
        return self.input_key(), self.wide

    def input_factor(self, k: int) -> np.ndarray | None:
        """The Mul's factor per input channel (1/s, 0 for an outlier channel), or None when nothing is done."""
        if not self.prepares_input:
            return None
        factor = np.ones(k, np.float32) if self.smoothing is None else (1.0 / self.smoothing).astype(np.float32)
        factor[list(self.outliers)] = 0.0
        return factor

    def int8_weight(self, w: np.ndarray) -> np.ndarray:
        """The [K, N] weight the int8 product multiplies: rows times s, outlier rows zero."""
        if self.smoothing is not None:
            w = w * self.smoothing[:, None]
        if self.outliers:
            w = w.copy()
            w[list(self.outliers)] = 0.0
        return w


@dataclass(frozen=True)
class Int8Form:
    """How every int8 Linear is made, beyond its plan.

    ``rounded``: int8 weights rounded elsewhere (error-compensated, from the calibration inputs), by
    :func:`rounding_key`; a Linear not in it is rounded to nearest. ``two_pass``: the activation is
    quantized twice, ``x ≈ x1 + x2`` with ``x1 = Q(x)`` and ``x2 = Q(x - x1)``, and both go through the
    int8 kernel (two MatMulIntegerToFloat, one Add): the per-tensor activation rounding error, which
    dominates on models whose activations have no outlier channel to smooth, shrinks ~100x for a second
    int8 GEMM and a few elementwise ops.
    """

    rounded: Mapping[tuple[str, PlanKey], qz.PerChannel] = field(default_factory=dict)
    two_pass: bool = False


def rounding_key(linear: str, plan: LinearPlan) -> tuple[str, PlanKey]:
    """The key of a Linear's rounded weight in :attr:`Int8Form.rounded` (one per way its input is prepared)."""
    return linear, plan.key()


@dataclass
class Int8Nodes:
    """The nodes computing one Linear in int8: ``prepare`` (smoothing Mul, DynamicQuantizeLinear; they
    read only the input and may already have been made for another Linear: then empty), ``matmul``,
    ``second`` (with two-pass activations: the second pass's MatMulIntegerToFloat and the Add) and
    ``outliers`` (the outlier channels' fp32 product added to it; empty without outliers)."""

    prepare: list[ir.Node]
    matmul: ir.Node
    outliers: list[ir.Node] = field(default_factory=list)
    second: list[ir.Node] = field(default_factory=list)

    @property
    def nodes(self) -> list[ir.Node]:
        """What computes the Linear's output from the prepared input, in order."""
        return [self.matmul, *self.second, *self.outliers]

    @property
    def output(self) -> ir.Value:
        return self.nodes[-1].outputs[0]


@dataclass
class Int8Builder(qz.NodeMaker):
    """Makes Linears' int8 nodes in ``graph``; a weight, a smoothed input or a quantized input is made once."""

    form: Int8Form = field(default_factory=Int8Form)
    #: (weight, plan key, id of its rounded weight) -> (8-bit weight, scales, zero points)
    _weights: dict[tuple[ir.Value, PlanKey, int | None], tuple[ir.Value, ir.Value, ir.Value]] = field(
        default_factory=dict
    )
    #: (input, input key) -> each pass's (quantized, scale, zero point)
    _inputs: dict[tuple[ir.Value, InputKey], list[list[ir.Value]]] = field(default_factory=dict)
    smoothing_muls: list[ir.Node] = field(default_factory=list)  # the Muls made, in order

    def linear(self, linear: Linear, plan: LinearPlan) -> Int8Nodes:
        prepare: list[ir.Node] = []
        key = (linear.input, plan.input_key())
        quantized = self._inputs.get(key)
        if quantized is None:
            x = linear.input
            label = x.name or linear.name
            factor = plan.input_factor(linear.kn()[0])
            if factor is not None:
                inverse = self._add(f"{label}_smooth", factor)
                mul = ir.node("Mul", [x, inverse], name=self.names(f"{label}_smooth_Mul"))
                qz.typed(mul.outputs[0], self.names(f"{label}_smoothed"), ir.DataType.FLOAT, x.shape)
                prepare.append(mul)
                self.smoothing_muls.append(mul)
                x = mul.outputs[0]
            quantized = [self._quantize(x, label, prepare)]
            if self.form.two_pass:
                restored = ir.node("DequantizeLinear", quantized[0], name=self.names(f"{label}_Dequantize"))
                qz.typed(restored.outputs[0], self.names(f"{label}_restored"), ir.DataType.FLOAT, x.shape)
                rest = ir.node("Sub", [x, restored.outputs[0]], name=self.names(f"{label}_rest_Sub"))
                qz.typed(rest.outputs[0], self.names(f"{label}_rest"), ir.DataType.FLOAT, x.shape)
                prepare += [restored, rest]
                quantized.append(self._quantize(rest.outputs[0], f"{label}_rest", prepare))
            self._inputs[key] = quantized
        rounded = self.form.rounded.get(rounding_key(linear.name, plan))
        # a rounded weight is its Linear's, or one array every reader of a shared weight uses (stored once)
        w_key = (linear.weight, plan.key(), id(rounded) if rounded is not None else None)
        stored = self._weights.get(w_key)
        if stored is None:
            p = rounded or qz.quantize_linear_int8(plan.int8_weight(linear.weight_array()), pairs=not plan.wide)
            q, zero_point = qz.as_uint8(p) if plan.wide else (p.q, np.zeros(p.q.shape[1], np.int8))
            stored = self._weights[w_key] = (
                self._add(f"{linear.weight.name}_int8", q),
                self._add(f"{linear.weight.name}_scale", p.scale.astype(np.float32)),
                self._add(f"{linear.weight.name}_zero_point", zero_point),
            )
        bias = linear.bias
        if bias is not None and len(_stored(bias).shape) == 2:
            bias = self._add(f"{linear.name}_bias", const_array(bias).reshape(-1).astype(np.float32))
        products = []
        for i, (xq, x_scale, x_zero_point) in enumerate(quantized):
            inputs: list[ir.Value | None] = [xq, stored[0], x_scale, stored[1], x_zero_point, stored[2]]
            if bias is not None and i == 0:
                inputs.append(bias)
            node = ir.node("MatMulIntegerToFloat", inputs, domain=MS_DOMAIN, name=self.names(f"{linear.name}_int8"))
            qz.typed(node.outputs[0], self.names(f"{linear.output.name}_int8"), ir.DataType.FLOAT, linear.output.shape)
            products.append(node)
        second = products[1:]
        if second:
            total = ir.node("Add", [p.outputs[0] for p in products], name=self.names(f"{linear.name}_int8_Add"))
            qz.typed(total.outputs[0], self.names(f"{linear.output.name}_int8"), ir.DataType.FLOAT, linear.output.shape)
            second.append(total)
        product = (second or products)[-1].outputs[0]
        return Int8Nodes(prepare, products[0], self._outliers(linear, plan, product), second)

    def _quantize(self, x: ir.Value, label: str, prepare: list[ir.Node]) -> list[ir.Value]:
        """DynamicQuantizeLinear(x), appended to ``prepare``: its (quantized, scale, zero point)."""
        dql = ir.node("DynamicQuantizeLinear", [x], num_outputs=3, name=self.names(f"{label}_DynamicQuantize"))
        for out, suffix, dtype, shape in zip(
            dql.outputs,
            ("quantized", "scale", "zero_point"),
            (ir.DataType.UINT8, ir.DataType.FLOAT, ir.DataType.UINT8),
            (x.shape, ir.Shape([]), ir.Shape([])),
        ):
            qz.typed(out, self.names(f"{label}_{suffix}"), dtype, shape)
        prepare.append(dql)
        return list(dql.outputs)

    def _outliers(self, linear: Linear, plan: LinearPlan, product: ir.Value) -> list[ir.Node]:
        """``product + Gather(x, outliers, axis=-1) @ W[outliers]`` (fp32), or nothing without outliers."""
        if not plan.outliers:
            return []
        label = linear.name
        channels = self._add(f"{label}_outlier_channels", np.array(plan.outliers, dtype=np.int64))
        rows = self._add(f"{linear.weight.name}_outlier_rows", linear.weight_array()[list(plan.outliers)])
        gather = ir.node("Gather", [linear.input, channels], {"axis": -1}, name=self.names(f"{label}_outliers"))
        qz.typed(gather.outputs[0], self.names(f"{label}_outlier_inputs"), ir.DataType.FLOAT, None)
        matmul = ir.node("MatMul", [gather.outputs[0], rows], name=self.names(f"{label}_outliers_MatMul"))
        qz.typed(matmul.outputs[0], self.names(f"{label}_outlier_product"), ir.DataType.FLOAT, None)
        add = ir.node("Add", [product, matmul.outputs[0]], name=self.names(f"{label}_outliers_Add"))
        qz.typed(
            add.outputs[0], self.names(f"{linear.output.name}_int8_outliers"), ir.DataType.FLOAT, linear.output.shape
        )
        return [gather, matmul, add]


class QuantizeLinearsResult(qz.QuantizedResult):
    """What :class:`QuantizeLinearsPass` did: the Linears it rewrote (by name)."""


class QuantizeLinearsPass(ir.passes.InPlacePass):
    """Rewrite the planned Linears (node name -> :class:`LinearPlan`) in int8; see the module doc."""

    def __init__(self, plan: dict[str, LinearPlan], form: Int8Form | None = None) -> None:
        super().__init__()
        self.plan = plan
        self.form = form or Int8Form()

    def call(self, model: ir.Model) -> QuantizeLinearsResult:
        graph = model.graph
        build = Int8Builder(graph, FreshNames(graph), self.form)
        quantized = []
        for linear in find_linears(model):
            plan = self.plan.get(linear.name)
            if plan is None:
                continue
            made = build.linear(linear, plan)
            if made.prepare:
                insert_after_producer(graph, linear.input, made.prepare)
            # at the bias Add: the product reads the bias, which exporters define between the MatMul and its Add
            graph.insert_before(linear.bias_add or linear.node, made.nodes)
            name = linear.output.name
            linear.output.replace_all_uses_with(made.output, replace_graph_outputs=True)
            for old in (linear.bias_add, linear.node):
                if old is not None:
                    graph.remove(old, safe=True)
            made.output.name = name
            quantized.append(linear.name)
        for mul in build.smoothing_muls:
            fold_into_layernorm(graph, mul, build.names)
        if quantized:
            model.opset_imports.setdefault(MS_DOMAIN, 1)
            drop_unused_initializers(graph)
        return QuantizeLinearsResult(model, quantized)


#: Normalisations whose output 0 is ``normalized * scale + bias`` per last-axis channel: op -> (scale, bias) inputs.
_AFFINE_NORMS = {("", "LayerNormalization"): (1, 2), (MS_DOMAIN, "SkipLayerNormalization"): (2, 3)}


def _norm_slots(x: ir.Value, graph: ir.Graph) -> tuple[int, int] | None:
    """The (scale, bias) inputs of the normalisation whose output 0 is ``x``, if its division by ``s`` can
    be folded into them (a last-axis LayerNormalization / SkipLayerNormalization of ``graph``)."""
    norm = x.producer()
    if norm is None or norm.graph is not graph or x is not norm.outputs[0] or x.is_graph_output():
        return None
    slots = _AFFINE_NORMS.get(("" if norm.domain == "ai.onnx" else norm.domain, norm.op_type))
    if slots is None or norm.attributes.get_int("axis", -1) != -1:
        return None
    for slot in slots:
        value = norm.inputs[slot] if len(norm.inputs) > slot else None
        if value is not None and (value.const_value is None or len(value.const_value.shape) != 1):
            return None
    return slots


def smoothing_folds(x: ir.Value, readers: Iterable[ir.Node]) -> bool:
    """Whether smoothing ``x`` for the Linears ``readers`` (their MatMul/Gemm nodes) costs no Mul: ``x`` is a
    normalisation's output that nothing else reads (but Shape), so the division folds into its scale and bias."""
    readers = set(readers)
    graph = next(iter(readers)).graph if readers else None
    if graph is None or _norm_slots(x, graph) is None:
        return False
    return all(user in readers or user.op_type == "Shape" for user, _ in x.uses())


def fold_into_layernorm(graph: ir.Graph, mul: ir.Node, names: FreshNames) -> bool:
    """``Mul(norm(x), 1/s)`` -> the norm with scale/s and bias/s, when nothing else reads its output 0
    (but Shape). Returns whether it folded."""
    x, inverse = mul.inputs
    assert x is not None  # the smoothing Mul's input (Int8Builder)
    slots = _norm_slots(x, graph)
    if slots is None:
        return False
    if any(user is not mul and user.op_type != "Shape" for user, _ in x.uses()):
        return False
    norm = x.producer()
    assert norm is not None and inverse is not None  # _norm_slots found it; the Mul's factor (Int8Builder)
    factor = const_array(inverse).reshape(-1)
    arrays: list[np.ndarray | None] = []
    for slot in slots:
        value = norm.inputs[slot] if len(norm.inputs) > slot else None
        if value is None:
            arrays.append(None)  # no bias: 0 / s is 0
            continue
        if value.const_value is None or tuple(value.const_value.shape) != factor.shape:
            return False
        arrays.append(const_array(value).astype(np.float32) * factor)
    for slot, array in zip(slots, arrays):
        if array is not None:
            scaled = norm.inputs[slot]
            assert scaled is not None  # its array was read above
            label = scaled.name or norm.name
            norm.replace_input_with(slot, add_initializer(graph, names(f"{label}_smoothed"), array))
    mul.outputs[0].replace_all_uses_with(x, replace_graph_outputs=True)
    graph.remove(mul, safe=True)
    return True


def drop_unused_initializers(graph: ir.Graph) -> None:
    """Weights nothing reads any more (a shared weight stays while anything reads it)."""
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output() and value not in graph.inputs:
            graph.initializers.pop(name)
