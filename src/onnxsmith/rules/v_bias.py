"""The value projection's bias folded into the output projection's bias.

Each row of attention weights sums to one, so a constant vector added to
every value comes out of the attention unchanged: attention(q, k, v + b_v) =
attention(q, k, v) + b_v, and after the output projection that is
``... @ W_o + (b_o + b_v @ W_o)``. One Add less per block, and the output
bias is then absorbed by SkipLayerNormalization.

Not with a KV cache (past values carry the bias already) or MHA's packed bias.
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import MatchResult, pattern

from onnxsmith.irutil.walk import constant
from onnxsmith.rules.weights import WeightAddingRule

# MultiHeadAttention inputs: query, key, value, bias, key_padding_mask, attention_bias, past_key, past_value, ...
_BIAS, _PAST_KEY = 3, 6


class ValueBiasThroughAttention(WeightAddingRule):
    def pattern(self, op, query, key, value, v_bias, o_weight, o_bias):
        attention = op.MultiHeadAttention(
            query, key, op.Add(value, v_bias), _allow_other_inputs=True, _domain="com.microsoft", _outputs=["attention"]
        )
        return op.Add(op.MatMul(attention, o_weight), o_bias)

    def check(self, context, v_bias, o_weight, o_bias, attention, **_) -> MatchResult:
        result = MatchResult()
        node = attention.producer()
        extra = node.inputs[_BIAS:]
        if len(extra) > 0 and extra[0] is not None:
            return result.fail("the attention has a packed q/k/v bias", node)
        if any(v is not None for v in node.inputs[_PAST_KEY:]) or len(node.outputs) > 1:
            return result.fail("the attention uses a KV cache (past values carry the bias)", node)
        bv, w, bo = constant(v_bias), constant(o_weight), constant(o_bias)
        if w is None or w.ndim != 2:
            return result.fail("the output projection weight is not a constant matrix", o_weight)
        if bv is None or bv.size != w.shape[0] or bv.shape[-1] != bv.size:
            return result.fail(f"the value bias is not a constant vector of {w.shape[0]}", v_bias)
        if bo is None or bo.size != w.shape[1] or bo.shape[-1] != bo.size:
            return result.fail(f"the output bias is not a constant vector of {w.shape[1]}", o_bias)
        self.remember_graph(context)
        return result

    def rewrite(self, op, query, key, value, v_bias, o_weight, o_bias, attention, **_):
        node = attention.producer()
        bv, w, bo = constant(v_bias), constant(o_weight), constant(o_bias)
        folded = bo.astype(np.float64).reshape(-1) + bv.astype(np.float64).reshape(-1) @ w.astype(np.float64)
        new_bias = self.new_weight(op, folded.astype(bo.dtype).reshape(bo.shape), f"{o_bias.name}/with_v_bias")
        inputs = [query, key, value, *node.inputs[_BIAS:]]
        while inputs and inputs[-1] is None:
            inputs.pop()
        unbiased = op.MultiHeadAttention(*inputs, **dict(node.attributes), _domain="com.microsoft")
        return op.Add(op.MatMul(unbiased, o_weight), new_bias)


v_bias_rules = pattern.RewriteRuleSet([ValueBiasThroughAttention.rule("ValueBiasIntoOutputBias")], commute=True)
