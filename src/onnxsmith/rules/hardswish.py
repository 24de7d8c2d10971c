"""Written-out hard swish -> x * HardSigmoid(x).

MobileNetV3-style networks (PaddleOCR's, and PyTorch code that spells ``x * relu6(x + 3) / 6``) export the
hard swish as four elementwise ops: Add 3, Clip 0..6, Mul by x, Div by 6 (or Mul by 1/6). HardSigmoid
(alpha 1/6, beta 0.5, from opset 6) computes ``clip(x / 6 + 0.5, 0, 1)`` in one pass: two passes over the
activation instead of four, exact up to the rounding of the division. (HardSwish itself needs opset 14;
onnxruntime runs HardSigmoid and Mul at any opset these models use.) Applied by ``int8`` (the CPU variant,
judged by cosine), not by ``fuse --precision fp32``: alpha * x + beta is not bit-exact to (x + 3) / 6, and
fuse's fp32 gate refused PP-OCR's text detector over a 1.8e-7 change in a saturated sigmoid map.
What it gains int8 on a MobileNetV3-style recogniser: docs/benchmarks.md.
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import MatchResult, pattern

from onnxsmith.irutil.walk import constant


def _is(value, expected: float) -> bool:
    array = constant(value)
    return array is not None and array.size == 1 and bool(np.isclose(float(array.reshape(())), expected, rtol=1e-4))


class WrittenOutHardSwish(pattern.RewriteRuleClassBase):
    """``(x * clip(x + 3, 0, 6)) / 6``, or ``* (1/6)``: the scale after the product."""

    def __init__(self, name: str, *, divide: bool) -> None:
        super().__init__(name)
        self._divide = divide

    def pattern(self, op, x, three, low, high, scale):
        product = op.Mul(x, op.Clip(op.Add(x, three), low, high))
        return op.Div(product, scale) if self._divide else op.Mul(product, scale)

    def check(self, context, three, low, high, scale, **_) -> MatchResult:
        result = MatchResult()
        if not (_is(three, 3.0) and _is(low, 0.0) and _is(high, 6.0)):
            return result.fail("not clip(x + 3, 0, 6)", three)
        if not _is(scale, 6.0 if self._divide else 1 / 6):
            return result.fail("the product is not divided by 6", scale)
        return result

    def rewrite(self, op, x, **_):
        return op.Mul(x, op.HardSigmoid(x, alpha=1 / 6, beta=0.5))


class WrittenOutHardSigmoid(pattern.RewriteRuleClassBase):
    """``clip(x + 3, 0, 6) / 6`` (the hard swish's gate, multiplied by x afterwards)."""

    def pattern(self, op, x, three, low, high, six):
        return op.Div(op.Clip(op.Add(x, three), low, high), six)

    def check(self, context, three, low, high, six, **_) -> MatchResult:
        result = MatchResult()
        if not (_is(three, 3.0) and _is(low, 0.0) and _is(high, 6.0) and _is(six, 6.0)):
            return result.fail("not clip(x + 3, 0, 6) / 6", three)
        return result

    def rewrite(self, op, x, **_):
        return op.HardSigmoid(x, alpha=1 / 6, beta=0.5)


hardswish_rules = pattern.RewriteRuleSet(
    [
        WrittenOutHardSwish.rule("hard swish, divided", divide=True),
        WrittenOutHardSwish.rule("hard swish, scaled", divide=False),
        WrittenOutHardSigmoid.rule(),
    ],
    commute=True,
)
