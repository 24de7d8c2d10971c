"""Convolutions in int8 for onnxruntime's CPU provider: QDQ around each Conv, which it runs as QLinearConv.

``Conv(x, W, b) [-> Relu] -> y`` becomes

    QuantizeLinear(x) -> DequantizeLinear -> Conv(., DequantizeLinear(Wq), DequantizeLinear(bq)) [-> Relu]
        -> QuantizeLinear -> DequantizeLinear -> y

with the weight int8 in 7 bits (quantization.CONV_INT8_LIMIT: exact on CPUs without VNNI too), symmetric,
one scale per output channel; the bias int32 at the scale
``x_scale * w_scale``; the activations uint8 with the scale and zero point given by the plan
(measured ranges of the calibration inputs: there is no dynamic QLinearConv). onnxruntime
fuses each such group into one QLinearConv (a Relu after the Conv drops out when the output's
zero point is 0) and keeps consecutive Convs' activations in uint8. Measured on AVX-512 VNNI
this is 1.1-3.5x the fp32 Conv at batch 8, where ConvInteger (quantize_dynamic's form) is
3-5x *slower* than fp32 (docs/int8.md).

A value is quantized once: a Conv's input that another planned Conv's output already is, or
that two planned Convs read, shares one QuantizeLinear/DequantizeLinear. A Conv's input is
given to that Conv only (a residual branch reading the same value stays fp32); its output is
given to every reader. The pass only rewrites what its plan names; it never runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames
from onnxsmith.irutil.tensors import tensor_dims
from onnxsmith.irutil.walk import const_array
from onnxsmith.passes import quantization as qz
from onnxsmith.passes.quantize_linears import drop_unused_initializers

#: QuantizeLinear/DequantizeLinear (per tensor; per channel from 13, com.microsoft's before).
MIN_OPSET = 10
PER_CHANNEL_OPSET = 13
MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class Conv:
    """A Conv by a constant fp32 weight (and bias), with the Relu that is its only reader if any."""

    node: ir.Node
    relu: ir.Node | None

    @property
    def name(self) -> str:
        name = self.node.name or self.node.outputs[0].name
        assert name is not None  # onnx-ir names the values of a graph
        return name

    @property
    def input(self) -> ir.Value:
        x = self.node.inputs[0]
        assert x is not None  # find_convs
        return x

    @property
    def output(self) -> ir.Value:
        """Where the int8 form's output is quantized: after the Relu if there is one."""
        return (self.relu or self.node).outputs[0]

    @property
    def weight(self) -> ir.Value:
        w = self.node.inputs[1]
        assert w is not None  # find_convs
        return w

    @property
    def bias(self) -> ir.Value | None:
        return self.node.inputs[2] if len(self.node.inputs) > 2 else None

    @property
    def shape(self) -> tuple[int, ...]:
        tensor = self.weight.const_value
        assert tensor is not None  # find_convs
        return tensor_dims(tensor)

    @property
    def group(self) -> int:
        return self.node.attributes.get_int("group", 1)


#: The weight ranks of the Convs that go int8: 1-D Convs (audio, HiFi-GAN: [B, C, T]) and 2-D ones, which
#: onnxruntime's CPU provider fuses with their QDQ into QLinearConv. It fuses 3-D ones too, but their int8
#: speed is unmeasured: they stay fp32 and the Convs table says so (:func:`int8_rank_problem`).
CONV_WEIGHT_RANKS = (3, 4)


def int8_rank_problem(conv: Conv) -> str:
    """Why a Conv of its kernel rank stays fp32, or "" for a 1-D or 2-D Conv."""
    rank = len(conv.shape)
    if rank in CONV_WEIGHT_RANKS:
        return ""
    return f"a {rank - 2}-D Conv: only 1-D and 2-D Convs go int8 (QLinearConv's speed on {rank - 2}-D unmeasured)"


def find_convs(model: ir.Model) -> list[Conv]:
    """Every Conv of the main graph whose weight (and bias) are constant fp32, in graph order (the 1-D and 2-D
    ones go int8; :func:`int8_rank_problem` says why the others stay fp32)."""
    found = []
    for node in model.graph:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        if node.inputs[0] is None or not all(_const_float(v) for v in node.inputs[1:] if v is not None):
            continue
        weight = node.inputs[1]
        assert weight is not None and weight.const_value is not None  # Conv's W is required; _const_float
        if len(weight.const_value.shape) < 3:
            continue  # not a convolution's weight: onnxruntime rejects the model anyway
        y = node.outputs[0]
        uses = list(y.uses())
        relu = None
        if len(uses) == 1 and not y.is_graph_output():
            user = uses[0][0]
            if user.op_type == "Relu" and user.domain in ("", "ai.onnx"):
                relu = user
        found.append(Conv(node, relu))
    return found


def _const_float(value: ir.Value) -> bool:
    return value.const_value is not None and value.const_value.dtype == ir.DataType.FLOAT


@dataclass(frozen=True)
class ConvPlan:
    """The activations' uint8 quantization: scale and zero point of the Conv's input and output."""

    x_scale: float
    x_zero_point: int
    y_scale: float
    y_zero_point: int


def uint8_params(low: float, high: float) -> tuple[float, int]:
    """Scale and zero point mapping [min(low, 0), max(high, 0)] onto 0..255 (0 exactly representable)."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = (high - low) / 255.0
    if not np.isfinite(scale) or scale <= 0:
        return 1.0, 0
    zero_point = int(np.clip(np.rint(-low / scale), 0, 255))
    return float(np.float32(scale)), zero_point


@dataclass
class ConvBuilder(qz.NodeMaker):
    """Makes Convs' int8 nodes in ``graph``; a quantized activation is made once per value and scale."""

    opset: int = PER_CHANNEL_OPSET  # below 13, weights are dequantized per channel by com.microsoft's op
    #: (value, scale, zero point) -> its DequantizeLinear's output
    _quantized: dict[tuple[ir.Value, float, int], ir.Value] = field(default_factory=dict)
    #: a DequantizeLinear output made here -> (scale, zero point)
    _made: dict[ir.Value, tuple[float, int]] = field(default_factory=dict)

    def conv(self, conv: Conv, plan: ConvPlan) -> tuple[list[ir.Node], list[ir.Node]]:
        """(nodes quantizing the input: empty if made already, the rest: the last one's output is the output)."""
        prepare, x = self.qdq(conv.input, plan.x_scale, plan.x_zero_point)
        label = conv.name
        p = qz.quantize_per_channel_int8(const_array(conv.weight).astype(np.float32), axis=0, limit=qz.CONV_INT8_LIMIT)
        nodes = [self._dequantize(f"{label}_weight", p.q, p.scale.astype(np.float32), axis=0)]
        inputs = [x, nodes[-1].outputs[0]]
        if conv.bias is not None:
            scale = (np.float64(plan.x_scale) * p.scale.astype(np.float64)).astype(np.float32)
            safe = np.where(scale == 0, 1.0, scale).astype(np.float64)
            bias = np.clip(np.rint(const_array(conv.bias).astype(np.float64) / safe), -(2**31), 2**31 - 1)
            nodes.append(self._dequantize(f"{label}_bias", bias.astype(np.int32), scale, axis=0))
            inputs.append(nodes[-1].outputs[0])
        node = conv.node
        new = ir.node("Conv", inputs, attributes=dict(node.attributes), name=self.names(f"{label}_int8"))
        qz.typed(new.outputs[0], self.names(f"{node.outputs[0].name}_int8"), ir.DataType.FLOAT, node.outputs[0].shape)
        nodes.append(new)
        if conv.relu is not None:
            relu = ir.node("Relu", [new.outputs[0]], name=self.names(f"{conv.relu.name or label}_int8"))
            qz.typed(relu.outputs[0], self.names(f"{conv.output.name}_relu"), ir.DataType.FLOAT, conv.output.shape)
            nodes.append(relu)
        after, _ = self.qdq(nodes[-1].outputs[0], plan.y_scale, plan.y_zero_point, cache=False)
        return prepare, nodes + after

    def qdq(self, x: ir.Value, scale: float, zero_point: int, *, cache: bool = True) -> tuple[list[ir.Node], ir.Value]:
        """QuantizeLinear -> DequantizeLinear of ``x`` (uint8); ([], the earlier result) if made already."""
        key = (x, scale, zero_point)
        if self._made.get(x) == key[1:]:  # already the quantized value (a planned Conv's output)
            return [], x
        if cache and key in self._quantized:
            return [], self._quantized[key]
        label = x.name or "x"
        s = self._add(f"{label}_scale", np.array(scale, dtype=np.float32))
        z = self._add(f"{label}_zero_point", np.array(zero_point, dtype=np.uint8))
        q = ir.node("QuantizeLinear", [x, s, z], name=self.names(f"{label}_Quantize"))
        qz.typed(q.outputs[0], self.names(f"{label}_uint8"), ir.DataType.UINT8, x.shape)
        dq = ir.node("DequantizeLinear", [q.outputs[0], s, z], name=self.names(f"{label}_Dequantize"))
        qz.typed(dq.outputs[0], self.names(f"{label}_dequantized"), ir.DataType.FLOAT, x.shape)
        if cache:
            self._quantized[key] = dq.outputs[0]
        self._made[dq.outputs[0]] = key[1:]
        return [q, dq], dq.outputs[0]

    def _dequantize(self, label: str, q: np.ndarray, scale: np.ndarray, axis: int) -> ir.Node:
        q_value = self._add(f"{label}_quantized", q)
        s_value = self._add(f"{label}_scale", scale)
        domain = "" if self.opset >= PER_CHANNEL_OPSET else MS_DOMAIN
        node = ir.node(
            "DequantizeLinear",
            [q_value, s_value],
            {"axis": axis},
            domain=domain,
            name=self.names(f"{label}_Dequantize"),
        )
        qz.typed(node.outputs[0], self.names(f"{label}_dequantized"), ir.DataType.FLOAT, ir.Shape(q.shape))
        return node


class QuantizeConvsResult(qz.QuantizedResult):
    """What :class:`QuantizeConvsPass` did: the Convs it rewrote (by name)."""


class QuantizeConvsPass(ir.passes.InPlacePass):
    """Rewrite the planned Convs (node name -> :class:`ConvPlan`) in QDQ form; see the module doc."""

    def __init__(self, plan: dict[str, ConvPlan]) -> None:
        super().__init__()
        self.plan = plan

    def call(self, model: ir.Model) -> QuantizeConvsResult:
        graph = model.graph
        if self.plan and model.opset_imports.get("", 1) < MIN_OPSET:
            raise ValueError(f"int8 Convs need opset {MIN_OPSET} or later, the model has {model.opset_imports.get('')}")
        opset = model.opset_imports.get("", 1)
        build = ConvBuilder(graph, FreshNames(graph), opset)
        quantized = []
        for conv in find_convs(model):
            plan = self.plan.get(conv.name)
            if plan is None:
                continue
            prepare, nodes = build.conv(conv, plan)
            graph.insert_before(conv.node, prepare + nodes)
            y, result = conv.output, nodes[-1].outputs[0]
            name = y.name
            y.replace_all_uses_with(result, replace_graph_outputs=True)
            for old in (conv.relu, conv.node):
                if old is not None:
                    graph.remove(old, safe=True)
            result.name = name
            quantized.append(conv.name)
        if quantized:
            drop_unused_initializers(graph)
            if opset < PER_CHANNEL_OPSET:
                model.opset_imports.setdefault(MS_DOMAIN, 1)
        return QuantizeConvsResult(model, quantized)
