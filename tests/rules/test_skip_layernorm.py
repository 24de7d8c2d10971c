"""rules/skip_layernorm.py: residual Add + LayerNorm -> SkipLayerNormalization with the projection's bias."""

import pytest

from onnxsmith.rules.skip_layernorm import skip_layernorm_rules
from tests.support.fusion import FACEAGE, assert_same_outputs, assert_untouched, fusion_trace, op_count, prepared_mlp


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_every_residual_layernorm_becomes_skip_layernorm_with_bias(exporter, tmp_path):
    step = fusion_trace(str(FACEAGE[exporter]))["Add + LayerNorm -> SkipLayerNormalization"]
    assert step.outcome.matched == 8  # norm2 of 4 blocks, norm1 of blocks 1-3, the final norm
    after = step.model_after()
    fused = [n for n in after.graph if n.op_type == "SkipLayerNormalization"]
    assert len(fused) == 8
    # The projection's bias rides along; the residual Adds are gone. Left: the patch embedding's
    # Pad + table, q's bias and the MLP's first bias (BiasGelu's, next) in each block.
    assert all(len(n.inputs) == 5 and n.inputs[4] is not None for n in fused)
    assert op_count(after, "Add") == 1 + 4 + 4
    # Block 0's norm1 reads the embeddings (no residual before it) and the neck's LN reads the CLS row.
    assert op_count(after, "LayerNormalization") == 2
    assert_same_outputs(step.before, step.after, tmp_path)


def test_leaves_a_graph_without_layernorm_untouched():
    assert_untouched(prepared_mlp(), "skip layernorm", skip_layernorm_rules)
