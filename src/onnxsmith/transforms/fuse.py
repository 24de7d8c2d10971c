"""``fuse``: a transformer graph rewritten into ONNX Runtime's fused contrib operators.

What either torch exporter writes for a ViT or BERT encoder becomes, per block, SkipLayerNormalization ->
projections -> RotaryEmbedding -> MultiHeadAttention -> SkipLayerNormalization -> MatMul -> BiasGelu -> MatMul,
in fp32 or (``precision='fp16'``) with MatMul, attention, RoPE and BiasGelu in fp16 and the residual stream and
LayerNorms fp32. The engine is :mod:`onnxsmith.fuse_engine` (its engine.py explains the steps: shapes, fusions,
row pruning, precision), this module its declaration. The result is verified against the source before it is
written (produce_variant).
"""

from __future__ import annotations

import onnx_ir as ir

from onnxsmith.core.transform import StepReport, Transform, TransformContext, register
from onnxsmith.fuse_engine.engine import make_fused
from onnxsmith.settings.fuse import FUSE, FuseOptions


@register
class Fuse(Transform, settings=FUSE):
    def apply(self, model: ir.Model, options: FuseOptions, context: TransformContext) -> StepReport:
        return make_fused(model, options, context, self.name)

    def repairs(self, options: FuseOptions) -> bool:
        return options.precision == "fp16"  # the precision engine keeps fp32 what the refusal comes from
