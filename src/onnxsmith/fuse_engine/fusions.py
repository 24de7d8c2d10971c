"""Step 2 of fuse, the fusions: the rule sets of rules/ in the order they run, each applied as often as it matches.

A fusion either matches or leaves the graph as it was and says why it did not (its :class:`RuleOutcome`). One
whose op exists only from a newer opset converts the model to that opset first, where its rules match.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import RewriteRuleSet

from onnxsmith.fuse_engine.report import opset_refused
from onnxsmith.irutil.types import infer_types
from onnxsmith.irutil.walk import all_nodes
from onnxsmith.passes.raise_opset import RaiseOpsetPass, default_opset
from onnxsmith.rules import (
    attention,
    bias_gelu,
    decoder_attention,
    layer_norm,
    layer_scale,
    noop_reshape,
    rotary,
    skip_layernorm,
    v_bias,
)
from onnxsmith.rules.apply import RuleOutcome, apply_rules, would_match
from onnxsmith.rules.cleanup import cleanup_rules

#: The fusions in the order they run: (name in the report, rule sets applied in turn).
FUSIONS: list[tuple[str, tuple[RewriteRuleSet, ...]]] = [
    ("written-out LayerNorm -> LayerNormalization", (layer_norm.layer_norm_rules, layer_norm.layer_norm_no_beta_rules)),
    ("erf GELU -> Gelu", (bias_gelu.gelu_rules,)),
    ("layer scale into projections", (layer_scale.layer_scale_rules,)),
    ("RoPE -> RotaryEmbedding", (rotary.prefix_rotary_rules, rotary.all_tokens_rotary_rules)),
    # a decoder's layer with a KV cache, its RoPE read from position_ids (not a constant table, which the entry
    # above takes)
    ("decoder attention -> RotaryEmbedding + GroupQueryAttention", (decoder_attention.decoder_attention_rules,)),
    ("softmax attention -> SDPA", (attention.sdpa_rules,)),
    ("SDPA -> MultiHeadAttention", (attention.mha_rules, attention.leftover_sdpa_rules)),
    # A MultiHeadAttention placed between head transposes: the pairs that cancel go, so its inputs are the
    # projections (whose biases the next entry takes in).
    ("no-op Transpose/Reshape pairs", (cleanup_rules, cleanup_rules, noop_reshape.noop_reshape_rules)),
    ("query scale into MultiHeadAttention", (attention.mha_scale_rules,)),
    ("value bias into output bias", (v_bias.v_bias_rules,)),
    ("q/k/v bias into MultiHeadAttention", (attention.mha_bias_rules,)),
    ("Add + LayerNorm -> SkipLayerNormalization", (skip_layernorm.skip_layernorm_rules,)),
    ("Add + Gelu -> BiasGelu", (bias_gelu.bias_gelu_rules,)),
]
#: Fusions whose op exists from an opset on: a model below it is converted first, where they match.
OPSET_NEEDED = {"written-out LayerNorm -> LayerNormalization": 17}


def apply_fusion(model: ir.Model, name: str, stages: tuple[RewriteRuleSet, ...]) -> RuleOutcome:
    """One entry of ``FUSIONS``, on shapes inferred afresh (the previous rewrites made new values).

    Where its op needs a newer opset than the model's and its rules match, the model is
    converted to that opset first; a model they do not match keeps its own.
    """
    infer_types(model)
    needed, opset = OPSET_NEEDED.get(name), default_opset(model)
    if needed and opset is not None and opset < needed and would_match(model, *stages):
        raised = RaiseOpsetPass(needed)(model)
        if not raised.modified:
            return RuleOutcome(name, 0, opset_refused(needed, opset, raised.reason))
        infer_types(model)
    return apply_rules(model, name, *stages)


def check_no_fusion_ops(model: ir.Model) -> None:
    """onnxscript's intermediate SDPA op must have become MultiHeadAttention: it is no ONNX Runtime op."""
    left = [n for n in all_nodes(model) if n.domain == attention.FUSION_DOMAIN]
    if left:
        raise RuntimeError(f"internal error: {len(left)} {left[0].op_type} node(s) of {attention.FUSION_DOMAIN} left")
