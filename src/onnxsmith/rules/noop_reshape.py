"""A Reshape to the shape its input already has is removed, and so is a pair of Reshapes that undo each other.

The dynamo exporter reshapes the attention output [batch, heads, tokens, d]
to [-1, heads, tokens, d] before transposing it back; the no-op Reshape sits
between SDPA and the transposes the MultiHeadAttention pattern absorbs. Where an
attention becomes MultiHeadAttention between its head reshapes (onnxscript's
fallback), a projection [batch, tokens, hidden] is split into heads and joined
back right away: the pair goes, and the projection (with its bias) feeds the
attention. With the dims named (passes/name_dims.py) the shapes compare equal,
batch included.
"""

from __future__ import annotations

from onnxscript.rewriter import MatchResult, pattern


class NoOpReshape(pattern.RewriteRuleClassBase):
    def pattern(self, op, x, shape):
        return op.Reshape(x, shape, _outputs=["reshaped"])

    def check(self, context, x, reshaped, **_) -> MatchResult:
        result = MatchResult()
        before, after = x.shape, reshaped.shape
        if before is None or after is None:
            return result.fail("a shape is unknown", x)
        if any(not isinstance(d, int) and d.value is None for d in before):
            return result.fail(f"the input has an unnamed dim: {before}", x)
        if before != after:
            return result.fail(f"{before} -> {after} is not a no-op", reshaped)
        return result

    def rewrite(self, op, x, **_):
        return op.Identity(x)


class NoOpReshapePair(NoOpReshape):
    def pattern(self, op, x, shape, back):
        return op.Reshape(op.Reshape(x, shape), back, _outputs=["reshaped"])


noop_reshape_rules = pattern.RewriteRuleSet([NoOpReshapePair.rule("NoOpReshapePair"), NoOpReshape.rule("NoOpReshape")])
