"""Fused ops that onnxruntime's CPU provider runs slower than their parts, taken apart (the int8 CPU variant's).

On onnxruntime's CPU provider com.microsoft SkipLayerNormalization (a scalar loop per token) is
several times slower than Add + LayerNormalization, and BiasGelu slower than Gelu (docs/int8.md has the
measurement). onnxruntime also makes both itself when it loads
a model (SkipLayerNormFusion: an Add of two [B, S, D] tensors into a LayerNormalization;
BiasGeluFusion: Add + Gelu). So:

* ``SkipLayerNormalization(x, skip, gamma, beta, bias)`` -> ``LayerNormalization(Sum(Add(x, bias),
  skip), gamma, beta)``; its sum output (3) is the Sum's. Mean and inverse-std outputs (training
  only) in use: left alone.
* ``BiasGelu(x, b)`` -> ``Gelu(Add(x, b))``: where ``x`` is a Linear's, the bias Add is the Linear's
  (quantize_linears folds it into the int8 product, and nothing is left for onnxruntime to fuse).
* An ``Add`` read by a LayerNormalization (a residual, or embeddings summed) is written ``Sum``: the
  same values, which onnxruntime's fusion does not match. An Add of a constant vector (a Linear's
  bias) stays: int8 folds it into the Linear.

The pass never runs a model; the int8 transform applies it before it measures anything.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxsmith.irutil.names import FreshNames

MS_DOMAIN = "com.microsoft"
#: LayerNormalization is an ONNX op from this opset on.
LAYER_NORM_OPSET = 17
#: Sum broadcasts as Add does from this opset on.
SUM_BROADCASTS_OPSET = 8
#: com.microsoft SkipLayerNormalization's epsilon when the attribute is absent.
SKIP_LAYER_NORM_EPSILON = 1e-12


class CpuUnfuseResult(ir.passes.PassResult):
    """What :class:`CpuUnfusePass` did: how many of each rewrite."""

    def __init__(self, model: ir.Model, skip_layer_norms: int, bias_gelus: int, sums: int) -> None:
        super().__init__(model, modified=bool(skip_layer_norms or bias_gelus or sums))
        self.skip_layer_norms = skip_layer_norms
        self.bias_gelus = bias_gelus
        self.sums = sums

    def note(self) -> str:
        parts = [
            f"{n} {what}"
            for n, what in (
                (self.skip_layer_norms, "SkipLayerNormalization -> Sum + LayerNormalization"),
                (self.bias_gelus, "BiasGelu -> bias Add + Gelu"),
                (self.sums, "Add before a LayerNormalization -> Sum"),
            )
            if n
        ]
        return (
            "for onnxruntime's CPU kernels: " + ", ".join(parts) + " (its SkipLayerNormalization measured 4-25x "
            "slower than Add + LayerNormalization, BiasGelu 1.4-2.5x slower than Gelu; it fuses an Add before a "
            "LayerNorm or Gelu itself at load time)"
        )


def _is_ms(node: ir.Node, op_type: str) -> bool:
    return node.domain == MS_DOMAIN and node.op_type == op_type


def _is_onnx(node: ir.Node, op_type: str) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type == op_type


def _bias_like(value: ir.Value) -> bool:
    """A constant scalar or vector (its rank unknown counts as one)."""
    tensor = value.const_value
    if tensor is None and not value.is_initializer():
        return False
    shape = tensor.shape if tensor is not None else value.shape
    return shape is None or len(shape) <= 1


def _present(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def _typed_like(value: ir.Value, like: ir.Value, name: str | None = None) -> ir.Value:
    """``value`` named ``name`` (if given), with ``like``'s type and shape where they are known."""
    if name is not None:
        value.name = name
    if like.type is not None:
        value.type, value.shape = like.type, like.shape
    return value


class CpuUnfusePass(ir.passes.InPlacePass):
    """Take SkipLayerNormalization and BiasGelu apart and keep residual Adds from being fused; see the module doc."""

    def call(self, model: ir.Model) -> CpuUnfuseResult:
        graph = model.graph
        names = FreshNames(graph)
        layer_norm = model.opset_imports.get("", 1) >= LAYER_NORM_OPSET
        skips = gelus = sums = 0
        for node in list(graph):
            if layer_norm and _is_ms(node, "SkipLayerNormalization") and self._skip_layer_norm(graph, node, names):
                skips += 1
            elif _is_ms(node, "BiasGelu") and len(node.inputs) == 2:
                self._bias_gelu(graph, node, names)
                gelus += 1
        broadcasting_sum = model.opset_imports.get("", 1) >= SUM_BROADCASTS_OPSET
        for node in list(graph):
            if broadcasting_sum and _is_onnx(node, "Add") and self._normalised_sum(node):
                node.op_type = "Sum"
                sums += 1
        return CpuUnfuseResult(model, skips, gelus, sums)

    @staticmethod
    def _normalised_sum(add: ir.Node) -> bool:
        """An Add (not of a constant vector: a bias) whose output a LayerNormalization normalises."""
        if len(add.inputs) != 2 or any(x is None or _bias_like(x) for x in add.inputs):
            return False
        return any(_is_onnx(user, "LayerNormalization") and index == 0 for user, index in add.outputs[0].uses())

    @staticmethod
    def _skip_layer_norm(graph: ir.Graph, node: ir.Node, names: FreshNames) -> bool:
        y, *stats = node.outputs[:3]
        if any(out.uses() or out.is_graph_output() for out in stats):
            return False  # mean / inverse std read: a training graph, left alone
        x, skip, gamma = node.inputs[:3]
        beta, bias = _present(node, 3), _present(node, 4)
        label = node.name or y.name
        made = []
        if bias is not None:
            add = ir.node("Add", [x, bias], name=names(f"{label}_bias"))
            _typed_like(add.outputs[0], y, names(f"{y.name}_biased"))
            made.append(add)
            x = add.outputs[0]
        total = ir.node("Sum", [x, skip], name=names(f"{label}_Sum"))
        _typed_like(total.outputs[0], y, names(f"{y.name}_sum"))
        epsilon = node.attributes.get_float("epsilon", SKIP_LAYER_NORM_EPSILON)
        norm = ir.node(
            "LayerNormalization",
            [total.outputs[0], gamma, *([beta] if beta is not None else [])],
            {"axis": -1, "epsilon": epsilon},
            name=names(f"{label}_LayerNormalization"),
        )
        made += [total, norm]
        graph.insert_before(node, made)
        outputs = [(y, norm.outputs[0])]
        if len(node.outputs) > 3:
            outputs.append((node.outputs[3], total.outputs[0]))
        for old, new in outputs:
            name = old.name
            _typed_like(new, old)
            old.replace_all_uses_with(new, replace_graph_outputs=True)
            old.name = None
            new.name = name
        graph.remove(node, safe=True)
        return True

    @staticmethod
    def _bias_gelu(graph: ir.Graph, node: ir.Node, names: FreshNames) -> None:
        x, bias = node.inputs
        y = node.outputs[0]
        label = node.name or y.name
        add = ir.node("Add", [x, bias], name=names(f"{label}_bias"))
        _typed_like(add.outputs[0], y, names(f"{y.name}_biased"))
        gelu = ir.node("Gelu", [add.outputs[0]], domain=MS_DOMAIN, name=names(f"{label}_Gelu"))
        graph.insert_before(node, [add, gelu])
        name = y.name
        _typed_like(gelu.outputs[0], y)
        y.replace_all_uses_with(gelu.outputs[0], replace_graph_outputs=True)
        y.name = None
        gelu.outputs[0].name = name
        graph.remove(node, safe=True)
