"""Linear layers (MatMul/Gemm by a constant weight) as int8 com.microsoft DynamicQuantizeMatMul.

``x @ W (+ b)`` becomes one ``DynamicQuantizeMatMul(x', Wq, w_scale, , b)``: the weight
int8, symmetric, one scale per output column (stored quantized: the int8 tensor and its
scales are what the file holds); the activation quantized per tensor to uint8 by the kernel
at run time (no calibrated scale to go stale). Measured on AVX-512 VNNI / AMX CPUs this is
onnxruntime's fastest int8 form for every transformer shape (docs/int8.md).

Optionally a Linear's input is *smoothed* (SmoothQuant): ``x' = x / s`` per input channel
and ``W' = diag(s) W``, the same product, with an outlier channel's range moved into the
weight, where per-column scales absorb it. The division is one Mul, shared by every Linear
that reads the same input with the same ``s``.

The pass only rewrites what its plan names (node -> :class:`LinearPlan`); which Linears go
int8, and with what smoothing, is decided from measurements elsewhere. It never runs a model.
A weight read by several planned Linears with the same smoothing is quantized once and shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import add_initializer
from onnxsmith.irutil.walk import const_array

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
        return self.node.inputs[0]

    @property
    def name(self) -> str:
        return self.node.name or self.output.name

    def kn(self) -> tuple[int, int]:
        k, n = self.weight.const_value.shape
        return (n, k) if self.transposed else (k, n)

    def weight_array(self) -> np.ndarray:
        """The weight as [K, N] float32."""
        w = const_array(self.weight).astype(np.float32)
        return w.T if self.transposed else w


def find_linears(model: ir.Model) -> list[Linear]:
    """Every MatMul / Gemm of the main graph whose B is a constant 2-D fp32 weight, in graph order."""
    found = []
    for node in model.graph:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
            continue
        weight = node.inputs[1]
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


def _is_vector(value: ir.Value, weight: ir.Value, transposed: bool) -> bool:
    """A constant fp32 [N] (or [1, N]) vector matching the weight's output columns."""
    tensor = value.const_value
    if tensor is None or tensor.dtype != ir.DataType.FLOAT:
        return False
    n = weight.const_value.shape[0 if transposed else 1]
    return tuple(tensor.shape) in ((n,), (1, n))


def quantize_columns(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``w`` [K, N] as int8 (symmetric, -127..127) with one fp32 scale per column (max |w| -> 127)."""
    absmax = np.abs(w.astype(np.float64)).max(axis=0)
    scale = absmax / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def smoothing_factors(channel_absmax: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's per-input-channel ``s_j = max|x_j|^alpha / max|W_j,:|^(1 - alpha)`` (1 where either is 0)."""
    x = np.asarray(channel_absmax, dtype=np.float64)
    wmax = np.abs(w.astype(np.float64)).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(x, alpha) / np.power(wmax, 1.0 - alpha)
    s = np.where((x > 0) & (wmax > 0) & np.isfinite(s), s, 1.0)
    return np.clip(s, 1e-4, 1e4).astype(np.float32)


@dataclass(frozen=True)
class LinearPlan:
    """How one Linear goes int8: smoothing factors per input channel, or none."""

    smoothing: np.ndarray | None = None


def int8_linear_nodes(
    graph: ir.Graph,
    linear: Linear,
    smoothing: np.ndarray | None,
    *,
    weights: dict,
    divisors: dict,
    names: FreshNames,
) -> tuple[list[ir.Node], ir.Value]:
    """The nodes computing ``linear`` in int8 (a smoothing Mul if needed, then DynamicQuantizeMatMul).

    ``weights`` / ``divisors`` are caches shared across calls, so a weight or a smoothed input
    read by several Linears is made once. The nodes are not yet in the graph.
    """
    nodes: list[ir.Node] = []
    label = linear.name
    x = linear.input
    key = (linear.weight, None if smoothing is None else smoothing.tobytes())
    if smoothing is not None:
        smoothed = divisors.get((x, key[1]))
        if smoothed is None:
            inverse = _new_weight(graph, names, f"{label}_smooth", (1.0 / smoothing).astype(np.float32))
            mul = ir.node("Mul", [x, inverse], name=names(f"{label}_smooth_Mul"))
            mul.outputs[0].name = names(f"{label}_smoothed")
            mul.outputs[0].dtype = ir.DataType.FLOAT
            mul.outputs[0].shape = x.shape
            nodes.append(mul)
            smoothed = mul.outputs[0]
            divisors[(x, key[1])] = smoothed
        x = smoothed
    stored = weights.get(key)
    if stored is None:
        w = linear.weight_array()
        if smoothing is not None:
            w = w * smoothing[:, None]
        q, scale = quantize_columns(w)
        stored = (
            _new_weight(graph, names, f"{linear.weight.name}_int8", q),
            _new_weight(graph, names, f"{linear.weight.name}_scale", scale),
        )
        weights[key] = stored
    inputs = [x, stored[0], stored[1]]
    if linear.bias is not None:
        bias = linear.bias
        if len(bias.const_value.shape) == 2:
            bias = _new_weight(graph, names, f"{label}_bias", const_array(bias).reshape(-1).astype(np.float32))
        inputs += [None, bias]
    node = ir.node("DynamicQuantizeMatMul", inputs, domain=MS_DOMAIN, name=names(f"{label}_int8"))
    node.outputs[0].dtype = ir.DataType.FLOAT
    node.outputs[0].shape = linear.output.shape
    nodes.append(node)
    return nodes, node.outputs[0]


class QuantizeLinearsPass(ir.passes.InPlacePass):
    """Rewrite the planned Linears (node name -> :class:`LinearPlan`) as DynamicQuantizeMatMul; see the module doc."""

    def __init__(self, plan: dict[str, LinearPlan]) -> None:
        super().__init__()
        self.plan = plan
        self.quantized: list[str] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        weights: dict = {}
        divisors: dict = {}
        names = FreshNames(graph)
        for linear in find_linears(model):
            plan = self.plan.get(linear.name)
            if plan is None:
                continue
            nodes, result = int8_linear_nodes(
                graph, linear, plan.smoothing, weights=weights, divisors=divisors, names=names
            )
            graph.insert_before(linear.node, nodes)
            name = linear.output.name
            linear.output.replace_all_uses_with(result, replace_graph_outputs=True)
            for old in (linear.bias_add, linear.node):
                if old is not None:
                    graph.remove(old, safe=True)
            result.name = name
            self.quantized.append(linear.name)
        if self.quantized:
            model.opset_imports.setdefault(MS_DOMAIN, 1)
            _drop_unused_initializers(graph)
        return ir.passes.PassResult(model, modified=bool(self.quantized))


def _drop_unused_initializers(graph: ir.Graph) -> None:
    """fp32 weights no Linear reads any more (a shared weight stays while anything reads it)."""
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output() and value not in graph.inputs:
            graph.initializers.pop(name)


def _new_weight(graph: ir.Graph, names: FreshNames, name: str, array: np.ndarray) -> ir.Value:
    return add_initializer(graph, names(name), array)
