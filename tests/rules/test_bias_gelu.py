"""rules/bias_gelu.py: erf GELU -> Gelu, then bias Add + Gelu -> BiasGelu."""

import pytest

from onnxsmith.rules.bias_gelu import bias_gelu_rules, gelu_rules
from tests.support.fusion import FACEAGE, assert_same_outputs, assert_untouched, fusion_trace, op_count, prepared_mlp


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_gelu_then_bias_gelu_in_every_mlp(exporter, tmp_path):
    trace = fusion_trace(str(FACEAGE[exporter]))
    gelu, bias_gelu = trace["erf GELU -> Gelu"], trace["Add + Gelu -> BiasGelu"]
    assert gelu.outcome.matched == 5  # 4 MLPs and the neck, in either exporter's operand order
    assert op_count(gelu.model_after(), "Erf") == 0
    assert bias_gelu.outcome.matched == 4  # the neck's Gemm has its bias inside: it stays Gelu
    after = bias_gelu.model_after()
    assert op_count(after, "BiasGelu") == 4 and op_count(after, "Gelu") == 1
    # Exact up to erf's implementation (onnxruntime's Gelu kernel has its own, CPU-dependent
    # erf), which the fixture's ill-conditioned LayerNorms amplify to ~1e-4 on the logits: a
    # tenth of what any reordering of a sum moves them, a thousandth of a wrong rewrite.
    assert_same_outputs(gelu.before, gelu.after, tmp_path / "gelu", atol=5e-4, rtol=1e-5)
    assert_same_outputs(bias_gelu.before, bias_gelu.after, tmp_path / "bias", atol=5e-4, rtol=1e-5)


def test_leaves_a_graph_without_gelu_untouched():
    model = prepared_mlp()
    assert_untouched(model, "gelu", gelu_rules)
    assert_untouched(model, "bias gelu", bias_gelu_rules)
