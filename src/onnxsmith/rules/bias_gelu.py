"""Bias Add + GELU -> com.microsoft BiasGelu.

Two onnxscript rule sets: the exact (erf) GELU spelled out in elementary ops
becomes com.microsoft Gelu, in every operand order the exporters write
(``x * (0.5 * (erf(x / sqrt 2) + 1))`` from dynamo, ``(x * (erf(..) + 1)) * 0.5``
from TorchScript); then Add(x, bias) + Gelu becomes BiasGelu.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import bias_gelu, erfgelu

gelu_rules = pattern.RewriteRuleSet(list(erfgelu.rules.rules), commute=True)
bias_gelu_rules = bias_gelu.bias_gelu_rules
