"""Attention -> com.microsoft MultiHeadAttention, q, k and v from three separate projections.

onnxscript's ORT fusions do the matching, in two steps:

1. ``SDPA`` finds softmax(q k^T * scale) v in the shapes both torch exporters
   write (k^T as one Transpose or as Reshape/Transpose/Reshape) and multiplies
   the scales they split between q and k^T (1/d^0.25 each) into one;
2. ``MHA`` absorbs the head reshapes and transposes around it, moving a
   RotaryEmbedding of q and k (rules/rotary.py) onto the [batch, tokens,
   hidden] projections. An SDPA the MHA patterns miss becomes MultiHeadAttention
   between transposes, so no private fusion op is ever left in the graph.

Then a scale multiplied into q is absorbed, and q/k biases become the MHA's
packed bias input. There is no packed QKV (Attention op): on GPU its Split was
the slowest kernel of the packed variant.
"""

from __future__ import annotations

from onnxscript.rewriter import MatchResult, pattern
from onnxscript.rewriter.ort_fusions import mha, mha_bias, mha_scale, sdpa, sdpa_via_mha

#: The domain of onnxscript's intermediate SDPA op; none may remain after the attention stages.
FUSION_DOMAIN = "ai.onnxruntime._fusion"


class SizedSDPA(sdpa.SDPA):
    """SDPA only where the head count is known, so the fallback to MultiHeadAttention always applies."""

    def check(self, context, query, key, value, mask, key_format, **bindings):
        result = super().check(context, query, key, value, mask, key_format, **bindings)
        if result and not isinstance(query.shape[1], int):
            return MatchResult().fail(f"the number of heads is not static: {query.shape}", query)
        return result


sdpa_rules = pattern.RewriteRuleSet([SizedSDPA.rule("ScaledDotProductAttention")])
mha_rules = mha.mha_rules_no_past
#: Whatever SDPA the MHA patterns did not take, as MultiHeadAttention between transposes.
leftover_sdpa_rules = sdpa_via_mha._rules
mha_scale_rules = mha_scale._mha_scale_rules
mha_bias_rules = mha_bias.mha_bias_rules
