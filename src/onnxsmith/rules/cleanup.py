"""Generic clean-ups before the fusions match: no-op arithmetic and Casts, Flatten as Reshape, ...

onnxscript's own rules, through its public module (``onnxscript.rewriter.rules.common``),
in the order of its ``_no_op.rules`` followed by ``basic_optimization_rules()``.
TorchScript writes float->float Casts; dynamo writes ``x * 1`` and Flatten before MatMul.
"""

from __future__ import annotations

from onnxscript.rewriter import RewriteRuleSet
from onnxscript.rewriter.rules import common

cleanup_rules = RewriteRuleSet(
    [
        # no-op arithmetic and Dropout
        *common.mul_by_1_rule.commute(),
        *common.add_0_rule.commute(),
        common.sub_0_rule,
        common.div_by_1_rule,
        common.dropout_zero_rule,
        common.dropout_inference_rule,
        # basic optimisations (flatten_to_reshape before reshape_reshape: they are order sensitive)
        common.cast_cast_rule,
        common.no_op_cast_rule,
        common.no_op_expand_rule,
        common.flatten_to_reshape_rule,
        common.reshape_reshape_rule,
        common.slice_split_rule,
        common.no_op_transpose_rule,
        common.transpose_transpose_rule,
        common.unsqueeze_unsqueeze_rule,
        common.squeeze_reshape_1d_rule,
    ]
)
