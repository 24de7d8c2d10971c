"""Residual Add + LayerNormalization -> com.microsoft SkipLayerNormalization (with the projection's bias).

onnxscript's SkipLayerNormFusion (its check and rewrite), with the bias added
before the residual taken into the op: ``LN((x + bias) + skip)``. Its own
pattern for that spells the residual Add's two orders as one OrValue, which
binds the first Add it meets (in a ViT, the previous residual, which is also
an Add) and then gives up; here each operand order is a rule of its own, so
the one whose bias is a [D] vector wins. Both exporters' orders are covered
(TorchScript writes ``Add(bias, MatMul)``). The second output, the sum, feeds
the next residual.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions.skip_normalization import SkipLayerNormFusion


class BiasedSkipLayerNormFusion(SkipLayerNormFusion):
    def __init__(self, name: str) -> None:
        super().__init__(name, has_bias=True, bias_pre_add=True)

    def pattern(self, op, input, skip, gamma, beta, bias):
        skip_sum = op.Add(op.Add(input, bias), skip)
        normalized = op.LayerNormalization(
            skip_sum, gamma, beta, axis=-1, _allow_other_attributes=True, _outputs=["layer_norm"]
        )
        return normalized, skip_sum


skip_layernorm_rules = pattern.RewriteRuleSet(
    [
        *BiasedSkipLayerNormFusion.rule("SkipLayerNormPreBias").commute(),
        SkipLayerNormFusion.rule("SkipLayerNormBias", has_bias=True, bias_pre_add=False),
        SkipLayerNormFusion.rule("SkipLayerNorm", has_bias=False),
    ]
)
