"""BatchNormalization folded into the Conv before it (onnxscript's rule, through its public module).

onnxruntime folds it itself when it loads an fp32 model; a Conv quantized in QDQ form has no
constant weight left to fold into, so ``int8`` folds first: the int8 weight is the folded one
and onnxruntime's QLinearConv is followed by the activation, not by a BatchNormalization.
"""

from __future__ import annotations

from onnxscript.rewriter import RewriteRuleSet
from onnxscript.rewriter.rules import common

batchnorm_rules = RewriteRuleSet([common.fuse_batchnorm_into_conv_rule])
