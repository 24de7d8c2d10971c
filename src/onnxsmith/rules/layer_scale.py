"""Layer scale folded into the projection it scales: (x @ W + b) * s  ->  x @ (W * s) + (b * s).

DINOv3, CaiT and many ViTs multiply each residual branch by a learned
per-channel vector. The Mul sits between the projection's bias and the
residual Add, where it hides the Add + LayerNorm pair from the SkipLayerNorm
fusion (and ORT's own attention fusion). Scaling the weight columns and the
bias instead is exact up to one rounding of each product.
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import MatchResult, pattern

from onnxsmith.irutil.walk import constant
from onnxsmith.rules.weights import WeightAddingRule


class LayerScaleFold(WeightAddingRule):
    def __init__(self, name: str, *, has_bias: bool) -> None:
        super().__init__(name)
        self._has_bias = has_bias

    def pattern(self, op, x, weight, bias, scale):
        y = op.MatMul(x, weight)
        if self._has_bias:
            y = op.Add(y, bias)
        return op.Mul(y, scale)

    def check(self, context, weight, bias, scale, **_) -> MatchResult:
        result = MatchResult()
        w, s = constant(weight), constant(scale)
        if w is None or w.ndim != 2 or w.dtype.kind != "f":
            return result.fail("the projection weight is not a constant 2-D float matrix", weight)
        if s is None or s.dtype != w.dtype:
            return result.fail("the scale is not a constant of the weight's type", scale)
        columns = w.shape[1]
        if s.size not in (1, columns) or (s.ndim and s.shape[-1] != s.size):
            return result.fail(f"the scale {list(s.shape)} is not per output channel ({columns})", scale)
        if self._has_bias:
            b = constant(bias)
            if b is None or b.dtype != w.dtype or b.size != columns or b.shape[-1] != columns:
                return result.fail(f"the bias is not a constant vector of {columns}", bias)
            if s.ndim > b.ndim:
                return result.fail("the scale has more dims than the bias", scale)
        self.remember_graph(context)
        return result

    def rewrite(self, op, x, weight, bias, scale, **_):
        s = constant(scale).astype(np.float64).reshape(-1)
        w = constant(weight)
        scaled = (w.astype(np.float64) * s).astype(w.dtype)
        y = op.MatMul(x, self.new_weight(op, scaled, f"{weight.name}/layer_scaled"))
        if self._has_bias:
            b = constant(bias)
            y = op.Add(y, self.new_weight(op, (b.astype(np.float64) * s).astype(b.dtype), f"{bias.name}/layer_scaled"))
        return y


layer_scale_rules = pattern.RewriteRuleSet(
    [LayerScaleFold.rule("LayerScaleWithBias", has_bias=True), LayerScaleFold.rule("LayerScale", has_bias=False)],
    commute=True,
)
