"""A LayerNorm written out in elementwise ops -> LayerNormalization.

Exporters below opset 17 (Paddle2ONNX's PP-OCR recognisers, TorchScript at opset 14)
write ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta`` over the last
axis as ReduceMean, Sub, Pow (or Mul), ReduceMean, Add, Sqrt, Div (or Mul by a
Reciprocal), Mul and Add. As one LayerNormalization it is one kernel, and the residual
Add before it becomes SkipLayerNormalization (rules/skip_layernorm.py).

onnxscript has the same idea (``rules/fusion/_layer_norm.py``, private, for opset 18's
ReduceMean with axes as an input); here both ReduceMean forms match, gamma and beta must
be constants over the normalised axis only, and beta is taken in. LayerNormalization
exists from opset 17: fuse_engine/fusions.py raises a lower opset first, only where this
matches (passes/raise_opset.py).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, pattern

_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16)


class WrittenOutLayerNorm(pattern.RewriteRuleClassBase):
    """The LayerNorm with gamma and beta; ``axes_input``: ReduceMean's axes as an input (opset 18)."""

    def __init__(self, name: str, *, axes_input: bool, beta: bool = True):
        super().__init__(name)
        self.axes_input, self.beta = axes_input, beta

    def _mean(self, op, x, axes, name: str):
        if self.axes_input:
            return op.ReduceMean(x, axes, _outputs=[name])
        return op.ReduceMean(x, _outputs=[name])

    def pattern(self, op, x, axes, axes2, epsilon, gamma, beta):
        deviation = op.Sub(x, self._mean(op, x, axes, "mean"))
        squared = pattern.OrValue([op.Pow(deviation, 2.0), op.Mul(deviation, deviation)])
        std = op.Sqrt(op.Add(self._mean(op, squared, axes2, "variance"), epsilon))
        normalized = pattern.OrValue([op.Div(deviation, std), op.Mul(deviation, op.Reciprocal(std))])
        scaled = op.Mul(normalized, gamma)
        return op.Add(scaled, beta) if self.beta else scaled

    def check(self, context, x, mean, variance, epsilon, gamma, beta=None, **_) -> MatchResult:
        result = MatchResult()
        if x.dtype not in _FLOATS:
            return result.fail(f"the input is {x.dtype}, not a float type", x)
        rank = None if x.shape is None else x.shape.rank()
        for reduced in (mean, variance):
            why = self._reduces_last_axis(reduced.producer(), rank)
            if why:
                return result.fail(why, reduced)
        eps = ir.convenience.get_const_tensor(epsilon)
        if eps is None or eps.size != 1:
            return result.fail("epsilon is not a constant scalar", epsilon)
        width = x.shape[-1] if x.shape is not None and rank else None
        for name, value in (("gamma", gamma), ("beta", beta)):
            if value is None:
                continue
            tensor = ir.convenience.get_const_tensor(value)
            if tensor is None:
                return result.fail(f"{name} is not a constant", value)
            if not isinstance(width, int) or tuple(tensor.shape) != (width,):
                return result.fail(f"{name} {tuple(tensor.shape)} does not match the normalised axis {width}", value)
            if tensor.dtype != x.dtype:
                return result.fail(f"{name} is {tensor.dtype}, the input {x.dtype}", value)
        return result

    def _reduces_last_axis(self, node: ir.Node, rank: int | None) -> str:
        if self.axes_input:
            tensor = ir.convenience.get_const_tensor(node.inputs[1]) if len(node.inputs) > 1 else None
            axes = None if tensor is None else [int(a) for a in tensor.numpy().ravel()]
        else:
            axes = node.attributes.get_ints("axes")
            axes = None if axes is None else list(axes)
        if node.attributes.get_int("keepdims", 1) != 1:
            return "a ReduceMean drops the reduced axis"
        if axes is None or len(axes) != 1 or axes[0] not in (-1, None if rank is None else rank - 1):
            return f"a ReduceMean reduces axes {axes}, not the last one"
        return ""

    def rewrite(self, op, x, epsilon, gamma, beta=None, **_):
        eps = float(ir.convenience.get_const_tensor(epsilon).numpy().ravel()[0])
        inputs = (x, gamma) if beta is None else (x, gamma, beta)
        return op.LayerNormalization(*inputs, axis=-1, epsilon=eps, stash_type=int(ir.DataType.FLOAT))


def _commuted(*rules: pattern.RewriteRule) -> pattern.RewriteRuleSet:
    return pattern.RewriteRuleSet([commuted for rule in rules for commuted in rule.commute()])


#: With beta first: matched node by node, the gamma Mul alone would match before the Add after it.
layer_norm_rules = _commuted(
    WrittenOutLayerNorm.rule("LayerNorm", axes_input=False),
    WrittenOutLayerNorm.rule("LayerNormAxesInput", axes_input=True),
)
layer_norm_no_beta_rules = _commuted(
    WrittenOutLayerNorm.rule("LayerNormNoBeta", axes_input=False, beta=False),
    WrittenOutLayerNorm.rule("LayerNormNoBetaAxesInput", axes_input=True, beta=False),
)
