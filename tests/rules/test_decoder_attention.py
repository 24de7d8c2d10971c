"""rules/decoder_attention.py: a Llama layer's attention with a KV cache -> RotaryEmbedding + GroupQueryAttention,
on both torch exporters' output of a tiny random-weight Llama (grouped-query: 4 query, 2 key/value heads)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnxsmith.analysis.lm_signature import lm_signature
from onnxsmith.io.load import load_model
from onnxsmith.rules.decoder_attention import decoder_attention_rules
from onnxsmith.runtime.lm_feeds import lm_feeds, lm_feeds_at
from tests.support.fusion import assert_untouched, fusion_trace, op_count, prepared_mlp
from tests.support.lm_models import llama_folder

NAME = "decoder attention -> RotaryEmbedding + GroupQueryAttention"
EXPORTERS = ("torchscript", "dynamo")


def _session(data: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _generate(session: ort.InferenceSession, sig, ids: np.ndarray, steps: int) -> list[np.ndarray]:
    """The logits of a prompt from an empty cache, then of ``steps`` greedy tokens through the model's own cache."""
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(names, lm_feeds(sig, ids))))
    logits = [out["logits"]]
    for _ in range(steps):
        token = out["logits"][:, -1].argmax(-1)[:, None]
        past = {p.name: out[p.name.replace("past_key_values", "present")] for p in sig.past}
        out = dict(zip(names, session.run(names, lm_feeds_at(sig, token, past))))
        logits.append(out["logits"])
    return logits


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_each_layer_becomes_one_grouped_query_attention(exporter):
    source = llama_folder(exporter) / "onnx" / "model.onnx"
    step = fusion_trace(str(source))[NAME]
    assert step.outcome.matched == 2  # one per layer
    after = step.model_after()
    ir.passes.common.RemoveUnusedNodesPass()(after)
    gqa = [n for n in after.graph if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and op_count(after, "RotaryEmbedding") == 4  # q and k of each layer
    assert {(n.attributes.get_int("num_heads"), n.attributes.get_int("kv_num_heads")) for n in gqa} == {(4, 2)}
    for op in ("Softmax", "Expand", "Neg", "IsNaN"):  # the attention, the heads repeated, rotate_half
        assert op_count(after, op) == 0, op
    # the cache stays the model's outputs, written by GroupQueryAttention in its own layout
    written = {o.name for o in after.graph.outputs if o.producer() in gqa}
    assert written == {f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")}
    # the rotation reads the graph's own cos/sin from position_ids: no table of a maximum length is stored
    rotary = [n for n in after.graph if n.op_type == "RotaryEmbedding"]
    assert all(n.inputs[2].const_value is None and n.inputs[3].const_value is None for n in rotary)
    # same logits as the source: a prompt from an empty cache, then greedy steps through each model's own cache,
    # at batch 1 and 2
    sig = lm_signature(load_model(source))
    before_session, after_session = _session(step.before), _session(step.after)
    rng = np.random.default_rng(0)
    for batch in (1, 2):
        ids = rng.integers(0, 256, (batch, 7))
        for want, got in zip(_generate(before_session, sig, ids, 4), _generate(after_session, sig, ids, 4)):
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_a_bias_not_computed_from_attention_mask_is_left_alone():
    """GroupQueryAttention masks by attention_mask's ones: a bias from anything else is not its to replace."""
    source = llama_folder() / "onnx" / "model.onnx"
    model = fusion_trace(str(source))[NAME].model_before()
    ir.passes.common.RemoveUnusedNodesPass()(model)  # what the rewriter's own cleanup would drop
    mask = next(v for v in model.graph.inputs if v.name == "attention_mask")
    mask.name = "padding"
    outcome = assert_untouched(model, "decoder attention", decoder_attention_rules)
    assert "not computed from an 'attention_mask' input" in outcome.reason


def test_leaves_a_graph_without_decoder_attention_untouched():
    assert_untouched(prepared_mlp(), "decoder attention", decoder_attention_rules)


def test_a_rotation_table_broadcast_over_the_batch_is_left_alone():
    """RotaryEmbedding reads one row per token: cos/sin of a [1, seq] position_ids (shared by the batch) are fewer."""
    source = llama_folder() / "onnx" / "model.onnx"
    model = fusion_trace(str(source))[NAME].model_before()
    ir.passes.common.RemoveUnusedNodesPass()(model)
    for node in model.graph:
        producer = node.inputs[0].producer() if node.op_type == "Unsqueeze" else None
        if producer is not None and producer.op_type in ("Cos", "Sin"):
            node.outputs[0].shape = ir.Shape([1, *node.outputs[0].shape[1:]])
    outcome = assert_untouched(model, "decoder attention", decoder_attention_rules)
    assert "like the tokens they rotate" in outcome.reason
