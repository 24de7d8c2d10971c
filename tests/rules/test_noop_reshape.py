"""rules/noop_reshape.py: a Reshape to its input's shape, and a pair of Reshapes that undo each other, go."""

import pytest
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxsmith.rules.noop_reshape import noop_reshape_rules
from tests.support.fusion import FACEAGE, assert_same_outputs, assert_untouched, fusion_trace, prepared_mlp
from tests.support.realmodels import real_model

STEP = "no-op Transpose/Reshape pairs"


@pytest.mark.realmodel
def test_head_split_and_join_around_attention_go(tmp_path):
    """MiniLM int8 (TorchScript): MultiHeadAttention sits between each projection's head Reshape/Transpose
    and the ones that join the heads back; once the pairs go, its q/k/v are the biased projections."""
    step = fusion_trace(str(real_model("minilm_int8")))[STEP]
    assert step.outcome.matched == 24  # 6 blocks x 4 pairs
    attentions = [node for node in step.model_after().graph if node.op_type == "MultiHeadAttention"]
    assert len(attentions) == 6
    for node in attentions:
        assert [v.producer().op_type for v in node.inputs[:3]] == ["Add"] * 3
    assert_same_outputs(step.before, step.after, tmp_path, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("exporter", sorted(FACEAGE))
def test_attention_without_pairs_is_untouched(exporter):
    step = fusion_trace(str(FACEAGE[exporter]))[STEP]
    assert step.outcome.matched == 0
    assert _nodes(step.model_before()) == _nodes(step.model_after())


def _nodes(model):
    RemoveUnusedNodesPass()(model)  # as the rewriter does after every rule set
    return [(node.op_type, [v.name if v is not None else "" for v in node.inputs]) for node in model.graph]


def test_leaves_a_graph_without_reshapes_untouched():
    assert_untouched(prepared_mlp(), "no-op Reshape", noop_reshape_rules)
