"""rules/attention.py: softmax attention -> SDPA -> MultiHeadAttention, q/k/v from three projections."""

import pytest

from onnxsmith.rules.attention import FUSION_DOMAIN, mha_rules, sdpa_rules
from tests.support.fusion import FACEAGE, assert_same_outputs, assert_untouched, fusion_trace, op_count, prepared_mlp


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_one_multihead_attention_per_block(exporter, tmp_path):
    trace = fusion_trace(str(FACEAGE[exporter]))
    sdpa, mha = trace["softmax attention -> SDPA"], trace["SDPA -> MultiHeadAttention"]
    assert sdpa.outcome.matched == 4 and mha.outcome.matched == 4
    after = mha.model_after()
    attention = [n for n in after.graph if n.op_type == "MultiHeadAttention"]
    assert len(attention) == 4
    assert op_count(after, "Softmax") == 0 and op_count(after, "Transpose") == 1  # the patch embedding's
    assert not any(n.domain == FUSION_DOMAIN for n in after.graph)
    for node in attention:
        assert node.attributes.get_int("num_heads") == 2
        # 1/sqrt(64): the exporters' q * 64**-0.25 and k^T * 64**-0.25, multiplied (the default).
        assert node.attributes.get_float("scale", 0.125) == pytest.approx(0.125)
        q, k, v = (node.inputs[i].producer() for i in range(3))
        assert len({q, k, v}) == 3  # three separate projections, no packed QKV
        assert q.op_type == k.op_type == "RotaryEmbedding" and v.op_type in ("MatMul", "Add")
        # MultiHeadAttention on [batch, tokens, hidden]: RoPE moved onto the projections themselves.
        assert all(x.inputs[0].shape.rank() == 3 for x in (q, k)) and node.inputs[2].shape.rank() == 3
    assert_same_outputs(sdpa.before, mha.after, tmp_path)


def test_leaves_a_graph_without_attention_untouched():
    model = prepared_mlp()
    assert_untouched(model, "sdpa", sdpa_rules)
    assert_untouched(model, "mha", mha_rules)
